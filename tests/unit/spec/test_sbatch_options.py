"""slurm.extra_sbatch_args: one option per element, none the script owns, as sbatch itself would read them.

The test models sbatch's reading of a script (its #SBATCH tokenizer, then getopt_long's prefix matching and short
option clusters, as Slurm's src/sbatch/opt.c and src/common/slurm_opt.c document them) and checks rendered scripts
against that model, for known abbreviation and cluster tricks and for hypothesis-drawn arguments.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.assemble import check, compile
from specdraft.errors import SpecError
from specdraft.render.sbatch import render_sbatch
from specdraft.spec.load import builtin_layout_text, load_layout_text
from specdraft.spec.validate.sbatch_options import MANAGED_LONG, MANAGED_SHORT, option_problem

# Every long option name of sbatch/srun/salloc's shared table, Slurm 20.11 to 25.x (getopt_long matches among all).
SBATCH_LONG = set(
    """accel-bind account acctg-freq argv array async autocomplete batch bb bbf bcast bcast-exclude
begin bell chdir cluster cluster-constraint clusters comment compress consolidate-segments constraint container
container-id context contiguous core-spec cores-per-socket cpu-bind cpu-freq cpu_bind cpus-per-gpu cpus-per-task
deadline debugger-test delay-boot dependency disable-status distribution environment epilog error exact exclude
exclusive export export-file external external-launcher extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus
gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help het-group hint hold ignore-pbs ignore-signals
immediate input interactive job-name jobid kill-command kill-on-bad-exit kill-on-invalid-dep label licenses mail-type
mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mem-update mincpus mpi msg-timeout multi-prog network nice
no-allocate no-bell no-kill no-requeue no-shell nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket ntasks-per-tres oom-kill-step open-mode output overcommit overlap oversubscribe
pack-group parsable partition power prefer preserve-env priority profile prolog propagate pty qos quiet
quit-on-interrupt reboot relative requeue reservation resources resv-ports runtime segment send-libs signal
slurmd-debug sockets-per-node spread-job spread-segments stepmgr switches task-epilog task-prolog tasks-per-node
test-only thread-spec threads threads-per-core time time-min tmp treewidth tres-bind tres-per-task uid unbuffered
usage use-min-nodes verbose version wait wait-all-nodes wait-for-children wckey whole wrap x11""".split()
)
SHORT_FLAGS = set("XhHlZOsEQuvVW")  # short options without a value; every other letter below takes one
SHORT_ALL = SHORT_FLAGS | set("AabDMCScdmexBGIiJKLTkFwNnopqrt")


def sbatch_words(text: str) -> list[str]:
    """The argv sbatch builds from a script's #SBATCH lines (its tokenizer: quotes, backslash, '#', whitespace)."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.lstrip().startswith("#"):
                break  # sbatch stops at the first command
            continue
        s, i = line[len("#SBATCH") :], 0
        while True:
            while i < len(s) and s[i] in " \t\v\f\r":
                i += 1
            arg, quoted, quote, escape = None, False, "", False
            while i < len(s) and (quoted or s[i] not in " \t\v\f\r"):
                c = s[i]
                if escape:
                    escape = False
                elif c == "\\":
                    escape, i = True, i + 1
                    continue
                elif quoted:
                    if c == quote:
                        quoted, i = False, i + 1
                        continue
                elif c in "\"'":
                    quoted, quote, i = True, c, i + 1
                    continue
                elif c == "#":
                    break
                arg, i = (arg or "") + c, i + 1
            assert not quoted, f"sbatch would stop at an unmatched quote in {line!r}"
            if arg is None:
                break
            words.append(arg)
    return words


def getopt_option(word: str) -> str | None:
    """The long name getopt_long resolves ``word`` to, '?' for an error, None for a non-option."""
    if word.startswith("--") and len(word) > 2:
        name = word[2:].split("=", 1)[0]
        if name in SBATCH_LONG:
            return name
        matches = sorted(n for n in SBATCH_LONG if n.startswith(name))
        return matches[0] if len(matches) == 1 else "?"
    if word.startswith("-") and len(word) > 1:
        for letter in word[1:]:
            if letter not in SHORT_ALL:
                return "?"
            if letter in MANAGED_SHORT:
                return MANAGED_SHORT[letter]
            if letter not in SHORT_FLAGS:
                return f"-{letter}"  # the rest of the word is its value
        return "-flags"
    return None


def _render(extra: list[str]):
    spec = load_layout_text(builtin_layout_text(), [f"slurm.extra_sbatch_args={extra!r}".replace("'", '"')])
    return render_sbatch(compile(spec), "/scratch/runs/x", python="/usr/bin/python3").script


ACCEPTED = [
    "--exclusive",
    "--constraint=h100",
    "--gpus=8",
    "--mem=0",
    "--gres=gpu:8",
    "-Ch100",
    "-H",
    "--hold",
    "--comment=run-7",
    "--reservation=r1",
    "-G2",
    "--dependency=afterok:12",
]
REFUSED = [
    "--arr=1-3",
    "--job-na=evil",
    "--chd=/",
    "--comment=x --chdir=/",
    "-vJx",
    "--tasks-per-node=2",
    "--n=3",
    "--gpus-per=1",
    "--comment='a b'",
    '--comment="a"',
    "--comment=a#b",
    "-x\\y",
    "--",
    "-",
    "--=x",
    "-J",
    "-Jevil",
    "-D/",
    "--output=/elsewhere",
    "--wrap=id",
    "exclusive",
    "--comment=a\tb",
]


def test_the_issues_examples_and_their_class():
    for arg in ACCEPTED:
        assert option_problem(arg) is None, arg
    for arg in REFUSED:
        assert option_problem(arg) is not None, arg
    # Every abbreviation of every option the script owns, except the real option --gpus.
    for name in MANAGED_LONG:
        for end in range(1, len(name) + 1):
            prefix = name[:end]
            assert (option_problem(f"--{prefix}=1") is None) == (prefix == "gpus"), prefix


def test_refused_arguments_are_reported_by_validate():
    bad = REFUSED[:8]
    spec = load_layout_text(builtin_layout_text(), ["slurm.extra_sbatch_args=" + repr(bad).replace("'", '"')])
    errors, _ = check(spec)
    assert {p.path for p in errors} == {f"slurm.extra_sbatch_args[{i}]" for i in range(len(bad))}, errors
    with pytest.raises(SpecError):
        compile(spec)


def test_rendered_script_owns_every_managed_option_once():
    script = _render(ACCEPTED)
    words = sbatch_words(script)
    assert words[-len(ACCEPTED) :] == ACCEPTED, "each extra argument reaches sbatch as exactly one word"
    resolved = [getopt_option(w) for w in words]
    managed = [r for r in resolved if r in MANAGED_LONG | set(MANAGED_SHORT.values())]
    assert len(managed) == len(set(managed)), f"a managed option appears twice: {managed}"
    assert "?" not in resolved


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(
        st.sampled_from(["-", "--"]),
        st.text(alphabet=st.sampled_from(list("-=abcdehijnoprstuwxACDJNT0123 #'\"\\:/,")), max_size=14),
    ).map("".join)
    | st.sampled_from(sorted(MANAGED_LONG)).flatmap(lambda n: st.integers(1, len(n)).map(lambda k, n=n: f"--{n[:k]}=v"))
    | st.text(alphabet=sorted(SHORT_ALL), min_size=1, max_size=4).map(lambda t: "-" + t)
)
def test_an_accepted_argument_is_one_word_that_sbatch_never_reads_as_a_managed_option(arg):
    if option_problem(arg) is not None:
        return
    line = f"#SBATCH {arg}\n"
    assert sbatch_words(line) == [arg]
    assert getopt_option(arg) not in MANAGED_LONG


def test_a_run_folder_with_a_backslash_is_refused_by_the_renderer():
    plan = compile(load_layout_text(builtin_layout_text()))
    with pytest.raises(ValueError, match="backslash"):
        render_sbatch(plan, "/scratch/a\\b", python="/usr/bin/python3")
    # The model shows why: sbatch would run the job in /scratch/ab while bash says /scratch/a\b.
    assert sbatch_words("#SBATCH --chdir='/scratch/a\\b'") == ["--chdir=/scratch/ab"]
