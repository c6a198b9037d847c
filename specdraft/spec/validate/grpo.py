"""Rules of the layout's `grpo` section and draft.refit_interval. Called by validate.validate_fields with its `err`
and `warn` collectors."""

from __future__ import annotations

import os
import re

from specdraft.errors import Problem
from specdraft.spec.derived import max_model_len
from specdraft.spec.schema import LayoutSpec

REWARD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
DIGIT_TASK_VOCAB = 16  # runtime/rl/tasks.py's digit tasks use token ids 0-14
VLLM_CPU_MIN_HEAD_DIM = 32  # vLLM's CPU attention serves head_dim 32..512 only
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")  # datafile.py's list


def grpo_rules(spec: LayoutSpec, err, warn) -> None:
    g = spec.grpo
    if spec.rollout.num_generations_per_prompt < 2:
        err(
            "rollout.num_generations_per_prompt",
            spec.rollout.num_generations_per_prompt,
            "must be >= 2: a group of one response has advantage 0 and never trains",
            "sample at least 2 responses per prompt (NeMo-RL's examples use 16)",
        )
    if not g.temperature >= 0:
        err("grpo.temperature", g.temperature, "must be >= 0", "use 0 for greedy or 1.0 for the policy's own sampling")
    if not g.reward_timeout_s > 0:
        err("grpo.reward_timeout_s", g.reward_timeout_s, "must be > 0", "e.g. 10")
    if g.sft_steps < 0:
        err("grpo.sft_steps", g.sft_steps, "must be >= 0", "use 0 to start RL at once")
    if g.draft_mode == "frozen" and not spec.draft.enabled:
        err(
            "grpo.draft_mode",
            g.draft_mode,
            "a frozen draft needs a draft: draft.enabled is false",
            "set draft.enabled: true, or grpo.draft_mode: cotrain",
        )
    if g.draft_mode == "frozen" and g.sft_steps < 1:
        err(
            "grpo.draft_mode",
            g.draft_mode,
            f"a frozen draft trains only in the SFT warm-up, and grpo.sft_steps is {g.sft_steps}",
            "set grpo.sft_steps >= 1 (e.g. 4), or grpo.draft_mode: cotrain",
        )
    elif g.draft_mode == "frozen" and spec.training.warmup_steps >= g.sft_steps:
        err(
            "grpo.draft_mode",
            g.draft_mode,
            f"the draft starts after training.warmup_steps ({spec.training.warmup_steps}), so a frozen draft would "
            f"never train in the {g.sft_steps} SFT warm-up steps",
            "set training.warmup_steps below grpo.sft_steps",
        )
    if not 0 <= g.ratio_clip_min < 1:
        err("grpo.ratio_clip_min", g.ratio_clip_min, "must be in [0, 1)", "NeMo-RL's default is 0.2")
    if not g.ratio_clip_max >= 0:
        err("grpo.ratio_clip_max", g.ratio_clip_max, "must be >= 0", "NeMo-RL's default is 0.2")
    if not g.reference_policy_kl_penalty >= 0:
        err("grpo.reference_policy_kl_penalty", g.reference_policy_kl_penalty, "must be >= 0", "use 0 for no KL")
    if g.reward not in ("task", "math-verify") and not REWARD_RE.match(g.reward):
        err(
            "grpo.reward",
            g.reward,
            "must be `task`, `math-verify` or a Python `module:function`",
            "e.g. my_rewards:score (importable on every node)",
        )
    if spec.workload == "grpo":
        _workload_rules(spec, err, warn)
    if g.task != "markov" and spec.model.vocab_size < DIGIT_TASK_VOCAB and spec.data.path is None:
        err(
            "grpo.task",
            g.task,
            f"the digit tasks need model.vocab_size >= {DIGIT_TASK_VOCAB} (got {spec.model.vocab_size})",
            "use a larger vocabulary or grpo.task: markov",
        )
    if spec.draft.refit_interval < 1:
        err("draft.refit_interval", spec.draft.refit_interval, "must be >= 1", "1 refits the draft every step")
    if not spec.draft.refit_drift_margin >= 0:
        err(
            "draft.refit_drift_margin",
            spec.draft.refit_drift_margin,
            "must be >= 0 (accept-length tokens the engines may fall behind before a drift refit)",
            "e.g. 0.2",
        )
    m = spec.model
    head_dim = m.kv_channels or (m.hidden_size // m.num_attention_heads if m.num_attention_heads > 0 else 0)
    if g.engine == "vllm" and spec.cluster.gpu == "cpu" and head_dim < VLLM_CPU_MIN_HEAD_DIM:
        warn(
            "grpo.engine",
            g.engine,
            f"vLLM on CPU serves head_dim >= {VLLM_CPU_MIN_HEAD_DIM} only; this model's is {head_dim}",
            "use grpo.engine: builtin, or the grpo-tiny-cpu layout (head_dim 32)",
        )
    rollout_rules(spec, err, warn)


def rollout_rules(spec: LayoutSpec, err, warn) -> None:
    """What the grpo workload's rollout instances can run: one engine per instance on the instance's own training
    ranks (colocated); the built-in engine on the instance's lead device alone (a warning above tp 1)."""
    if spec.workload != "grpo":
        return
    r, g = spec.rollout, spec.grpo
    if not r.colocated:
        err(
            "rollout.colocated",
            r.colocated,
            "the grpo workload runs each rollout instance on its training ranks; dedicated rollout nodes are not "
            "built (their engines would need ranks and a refit path outside the training world)",
            "set rollout.colocated: true (and rollout.num_nodes: 0)",
        )
    if g.engine == "builtin" and r.tp > 1:
        warn(
            "grpo.engine",
            g.engine,
            f"the built-in engine serves an instance on its lead's device alone: at rollout.tp {r.tp}, {r.tp - 1} of "
            "each instance's devices idle while it generates (rollout.tp sets how many instances there are)",
            "set rollout.tp: 1, or grpo.engine: vllm to serve each instance at rollout.tp",
        )


def _workload_rules(spec: LayoutSpec, err, warn) -> None:
    """What the grpo workload needs of its prompts, rewards and engines (a grpo layout: its job runs them)."""
    g, d, m = spec.grpo, spec.data, spec.model
    if d.path is not None:
        if g.reward == "task":
            err(
                "grpo.reward",
                g.reward,
                "`task` scores a built-in task's answers, but data.path gives the prompts",
                "use grpo.reward: math-verify (the row's answer against the response text), or your own "
                "module:function",
            )
        if d.format == "text":
            err(
                "data.format",
                d.format,
                "GRPO needs a prompt and a reference answer per row; `text` rows have neither",
                "use rows of messages, prompt/response or problem/expected_answer (docs/grpo.md)",
            )
    elif m.path is not None:
        folder = os.path.expanduser(m.path)
        if os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
            err(
                "data.path",
                None,
                f"the built-in grpo.task {g.task!r} writes its prompts in token ids of its own, which mean something "
                f"else to the tokenizer in model.path ({m.path})",
                "set data.path to your prompt file (jsonl or parquet; docs/grpo.md lists the row formats)",
            )
    if d.path is None and g.reward == "math-verify" and g.task == "markov":
        err(
            "grpo.reward",
            g.reward,
            "math-verify compares a response with the prompt's answer; the markov task's prompts have none",
            "use grpo.reward: task, or grpo.task: arithmetic or reverse",
        )
    positions = m.max_position_embeddings or m.seq_length
    if max_model_len(spec) > positions:
        err(
            "rollout.max_model_len" if spec.rollout.max_model_len is not None else "rollout.prompt_length",
            max_model_len(spec),
            f"the engines' max_model_len (prompt_length + max_response_length, or max_model_len) exceeds the "
            f"policy's max_position_embeddings ({positions}): vLLM refuses it",
            f"keep prompt_length + max_response_length <= {positions}, or set rollout.max_model_len",
        )


def find_module(name: str) -> bool:
    """Whether ``import name`` would find a module here, looked up without running any of it: the top-level name
    by importlib.util.find_spec (which imports nothing for it), each submodule by its parent's search path (find_spec
    of a dotted name would import the parents, i.e. run the user's package code)."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        found = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            where = found.submodule_search_locations if found is not None else None
            if where is None:
                return False
            found = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(where))
    except (ImportError, ValueError):
        return False
    return found is not None


def reward_problem(reward: str) -> Problem | None:
    """A `module:function` grpo.reward whose module this Python cannot find: the ranks would fail to import it
    once they have started, so `validate` and a GRPO launch refuse it first. The module is never imported here."""
    if reward in ("task", "math-verify") or not REWARD_RE.match(reward):
        return None
    module = reward.partition(":")[0]
    if find_module(module):
        return None
    return Problem(
        path="grpo.reward",
        value=reward,
        rule=f"no module {module!r} on this Python's path (PYTHONPATH, site-packages), so the ranks cannot import it",
        fix="put the folder holding it on PYTHONPATH on every node (the ranks import it there), e.g. "
        "`PYTHONPATH=/path/to/rewards specdraft launch ...`, or pip install it; or use grpo.reward: task",
    )
