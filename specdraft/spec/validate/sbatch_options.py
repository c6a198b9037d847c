"""`slurm.extra_sbatch_args`: each element is exactly one sbatch option, and never one the rendered script owns.

sbatch reads `#SBATCH` lines with its own tokenizer (whitespace splits, quotes group and vanish, `\\` escapes even
inside single quotes, an unquoted `#` starts a comment: src/sbatch/opt.c, _get_argument) and then getopt_long, which
takes any unambiguous prefix of a long option (`--chd=/` is `--chdir=/`) and clustered short options (`-vJx` is
`-v -J x`). Option names below are those of Slurm 20.11 to 25.x (src/common/slurm_opt.c).
"""

from __future__ import annotations

import re

# Long options the script sets (or that would break submitit's tracking of the job's tasks and logs).
# tasks-per-node is Slurm's alias of ntasks-per-node.
MANAGED_LONG = frozenset(
    {
        "job-name",
        "nodes",
        "ntasks-per-node",
        "tasks-per-node",
        "ntasks",
        "gpus-per-node",
        "cpus-per-task",
        "time",
        "partition",
        "account",
        "qos",
        "chdir",
        "output",
        "error",
        "open-mode",
        "signal",
        "array",
        "wrap",
    }
)
MANAGED_SHORT = {
    "J": "job-name",
    "N": "nodes",
    "n": "ntasks",
    "c": "cpus-per-task",
    "t": "time",
    "p": "partition",
    "A": "account",
    "q": "qos",
    "D": "chdir",
    "o": "output",
    "e": "error",
    "a": "array",
}
# Real sbatch options that are also a prefix of a managed one; getopt_long prefers an exact match, so these are
# themselves, not abbreviations (the only one in Slurm 20.11-25.x: --gpus, a prefix of --gpus-per-node).
EXACT_OPTIONS_THAT_PREFIX_MANAGED = frozenset({"gpus"})
# Short options that take a value, attached as in -Ch100; any other letter is a flag, and letters after a flag
# would be read as more options.
SHORT_WITH_VALUE = frozenset("bBCdFGiIkKLmMrSTwx")
# What sbatch's #SBATCH tokenizer treats specially: the element would not reach getopt as written.
SPECIAL = re.compile(r"[\s'\"\\#\x00-\x1f\x7f]")
FIX_ONE = "write one option per element, its value after '=' (e.g. --constraint=h100)"
FIX_MANAGED = "set the layout field instead (cluster.*, slurm.partition/account/qos/time/cpus_per_task)"


def option_problem(arg: str) -> tuple[str, str] | None:
    """(rule, fix) when ``arg`` is not one safe sbatch option; None when it is."""
    if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--="):
        return "must be one sbatch option starting with '-'", "e.g. --exclusive or --constraint=h100"
    special = SPECIAL.search(arg)
    if special:
        return (
            f"must be exactly one option: sbatch's #SBATCH reader would split, unquote, unescape or cut it at "
            f"{special.group()!r}",
            FIX_ONE,
        )
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        if name in MANAGED_LONG:
            return _managed(f"--{name}")
        if name not in EXACT_OPTIONS_THAT_PREFIX_MANAGED:
            matches = sorted(m for m in MANAGED_LONG if m.startswith(name))
            if matches:
                return (
                    f"sbatch reads --{name} as an abbreviation of {' or '.join('--' + m for m in matches)}, "
                    "which specdraft sets itself",
                    FIX_MANAGED,
                )
        return None
    letter = arg[1]
    if letter in MANAGED_SHORT:
        return _managed(f"-{letter} (--{MANAGED_SHORT[letter]})")
    if len(arg) > 2 and letter not in SHORT_WITH_VALUE:
        return (f"-{letter} takes no value, so sbatch would read {arg[2:]!r} as more options", FIX_ONE)
    return None


def _managed(option: str) -> tuple[str, str]:
    return (
        f"specdraft sets {option} itself (from the layout, or for submitit's tracking of the job's tasks and logs)",
        FIX_MANAGED,
    )
