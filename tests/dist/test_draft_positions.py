"""The co-trained draft's later positions accept when vLLM serves it, as they do in the training-time test.

One real run of the shipped GRPO toy (grpo-tiny-cpu on one process, the built-in engine, seed 0, 40 steps): by its
last steps the policy greedily walks a two-token cycle, and a draft that carries its un-normalised hidden state from
step to step (EAGLE-3, draft.norm_output false) proposes step 0's token again at step 1: vLLM accepted 1.0 / 0 / 0
of positions 1-3. EAGLE-3.1's post-norm hidden state (the default) gives 1.0 / 1.0 / 1.0; at 28 steps, before the
trainer's own later positions settle (step 33), it gave 1.0 / 0.058 / 0 (docs/speculative.md). The run's draft and
policy are exported and served by one vLLM engine (EAGLE-3 speculation, k 3, greedy) on held-out prompts; on the
same greedy tokens the draft's own TTT unroll (what the trainer optimises) is replayed as verify steps, and the
built-in decoders draft them too:

- vLLM's per-position acceptance is the TTT unroll's on those tokens, and so is each built-in decoder's (the GRPO
  engine's with its own budget: it drafts no more tokens than are left to generate);
- position 1 accepts at least 0.8 of verify steps and position 2 at least half as often as position 1 (an EAGLE-3
  draft fails here).

One vLLM engine for the module; skipped without vLLM.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.distributed import run_distributed
from tests.support.draft_positions import measure
from tests.support.paths import REPO, SHIPPED
from tests.support.vllm_runs import requires_vllm, specdraft

# A GRPO run and an engine start crawl on a loaded 2-core machine; about 6 minutes when idle.
pytestmark = [pytest.mark.dist, requires_vllm, pytest.mark.timeout(2400)]
STEPS, K, PROMPTS, PROMPT_LENGTH, MAX_NEW = 40, 3, 16, 8, 16
RUN = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1", "training.seed=0", "grpo.engine=builtin"]
RUN += ["slurm.time=00:40:00"]  # the local executor stops a run at slurm.time; the last step is saved


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from specdraft.runtime.serve import offline
    from specdraft.runtime.train.data import MarkovData

    root = tmp_path_factory.mktemp("positions")
    run = root / "run"
    launch = ["--workload", "grpo", "--steps", STEPS, "--executor", "local", "--run-dir", run]
    specdraft("launch", SHIPPED / "grpo-tiny-cpu.yaml", *RUN, *launch, cwd=root, timeout=2000)
    specdraft("export", run, "-o", root / "draft", cwd=root)
    specdraft("export", run, "--policy", "-o", root / "policy", cwd=root)
    data = MarkovData.for_plan(offline.read_run_plan(run))
    prompts = [data.prompt(STEPS - 1, i, PROMPT_LENGTH).tolist() for i in range(PROMPTS)]
    (root / "prompts.json").write_text(json.dumps(prompts))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.vllm_positions", str(run), str(root / "policy"), str(root / "draft")]
        + ["--prompts", str(root / "prompts.json"), "--k", str(K), "--max-new", str(MAX_NEW)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    vllm = json.loads(proc.stdout.strip().splitlines()[-1])
    vllm["acceptance"] = [n / vllm["drafts"] for n in vllm["per_pos"]]
    sequences = [p + t for p, t in zip(prompts, vllm["tokens"])]
    args = (str(run), str(root / "policy"), str(root / "draft"), sequences, PROMPT_LENGTH, K)
    mine = run_distributed(measure, 1, *args, timeout=900)[0]
    print(json.dumps({"vllm": vllm["acceptance"], **{key: mine[key] for key in ("ttt", "builtin", "rl_builtin")}}))
    print(json.dumps({"ttt_budgeted": mine["ttt_budgeted"], "verify_steps": mine["verify_steps"]}))
    return vllm, mine


def test_vllm_accepts_what_the_training_time_test_accepts(served):
    vllm, mine = served
    assert vllm["drafts"] == mine["verify_steps"], "vLLM's verify steps are the replayed TTT's"
    assert vllm["acceptance"] == pytest.approx(mine["ttt"], abs=0.03), (vllm["acceptance"], mine["ttt"])
    assert mine["builtin"] == pytest.approx(mine["ttt"], abs=0.03), "rollout measure's chained drafting"
    # the GRPO engine drafts no more tokens than are left to generate, so its last steps have fewer positions
    assert mine["rl_builtin"] == pytest.approx(mine["ttt_budgeted"], abs=0.03), "the GRPO builtin engine's"
    assert vllm["tokens"] == mine["builtin_tokens"], "both decodes are greedy decoding, token for token"


def test_the_drafts_later_positions_accept(served):
    vllm, mine = served
    for name, acceptance in (("vllm", vllm["acceptance"]), ("ttt", mine["ttt"])):
        assert acceptance[0] >= 0.8, (name, acceptance, "trained enough for position 1 to accept well")
        assert acceptance[1] >= 0.5 * acceptance[0], (name, acceptance, "position 2 at least half as often")
