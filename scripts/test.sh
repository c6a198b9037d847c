#!/usr/bin/env bash
# What `make test` runs once the venv is installed: the whole pytest suite (extra args go to pytest),
# with the real local Slurm cluster up so that the `slurm`-marked tests run instead of skipping.
# As root with apt-get (or Slurm already installed) the cluster is mandatory: if it will not come up,
# this fails rather than silently skipping. It is torn down on exit only if this script started it.
# pytest's exit code is passed through; 5 (no tests collected) stays a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

started_cluster=0
# shellcheck disable=SC2317 # invoked by the EXIT trap
on_exit() {
	local rc=$?
	if ((started_cluster)); then
		scripts/local-slurm.sh down || echo "[test.sh] WARNING: cluster teardown failed" >&2
	fi
	exit "$rc"
}
trap on_exit EXIT
# Turn Ctrl-C and kill into a normal exit, so the EXIT trap still tears the cluster down.
trap 'exit 130' INT
trap 'exit 143' TERM

if ((EUID != 0)); then
	echo "[test.sh] NOTE: not root, so no local Slurm cluster: slurm-marked tests will be SKIPPED (unless one is already up)"
elif ! command -v apt-get >/dev/null && ! command -v slurmctld >/dev/null; then
	echo "[test.sh] NOTE: no apt-get and no Slurm installed: slurm-marked tests will be SKIPPED"
else
	if scripts/local-slurm.sh status >/dev/null 2>&1; then
		echo "[test.sh] using the local Slurm cluster that is already up (left running afterwards)"
	else
		started_cluster=1
		if ! scripts/local-slurm.sh up 4; then
			echo "[test.sh] ERROR: the local Slurm cluster did not come up; refusing to skip the slurm tests" >&2
			exit 1
		fi
	fi
	export SPECDRAFT_SLURM=1
fi

rc=0
if [[ "${SPECDRAFT_SLURM:-}" == 1 && $# -eq 0 ]]; then
	# The Slurm tests spend most of their time waiting on the scheduler (a requeued job's hold, a 2-minute time
	# limit): they run beside the rest, in a second pytest with its own temp folder, and print when both are done.
	tmp=$(mktemp -d)
	.venv/bin/pytest -m slurm -p no:cacheprovider --basetemp "$tmp/slurm" >"$tmp/slurm.log" 2>&1 &
	slurm_pid=$!
	.venv/bin/pytest -m "not slurm" --basetemp "$tmp/rest" || rc=$?
	slurm_rc=0
	wait "$slurm_pid" || slurm_rc=$?
	echo "[test.sh] the slurm-marked tests (run beside the others):"
	cat "$tmp/slurm.log"
	rm -rf "$tmp"
	for code in "$rc" "$slurm_rc"; do
		if ((code == 5)); then
			echo "[test.sh] ERROR: pytest collected no tests (exit 5)" >&2
		fi
	done
	((rc != 0)) || rc=$slurm_rc
	exit "$rc"
fi
.venv/bin/pytest "$@" || rc=$?
if ((rc == 5)); then
	echo "[test.sh] ERROR: pytest collected no tests (exit 5)" >&2
fi
exit "$rc"
