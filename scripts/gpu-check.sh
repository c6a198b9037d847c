#!/usr/bin/env bash
# The project's GPU check: on a CUDA machine with torch preinstalled and no network, install the other
# dependencies from a folder of wheels and the project itself into a private site folder, then run
# benchmarks/gpu_check.py, which prints (a) branch attention vs a float64 reference on the GPU, (b) its speed and
# memory beside the SDPA floor and FlexAttention, (c) one-GPU co-training beside a plain PyTorch step.
#
#   scripts/gpu-check.sh WHEELS_DIR [gpu_check.py options, e.g. --parts a b]     (or: make gpu-check WHEELS=DIR)
#
# WHEELS_DIR holds megatron-core, omegaconf (>= 2.4), submitit and the other wheels for the GPU machine's Python
# (docs/gpu.md, "The wheels", says how to download them). PYTHON picks the interpreter (default python3), and
# SPECDRAFT_GPU_SITE the site folder (default /tmp/specdraft-site).
set -euo pipefail

usage="usage: scripts/gpu-check.sh WHEELS_DIR [options for benchmarks/gpu_check.py]"
if [ $# -lt 1 ]; then
    echo "$usage" >&2
    exit 2
fi
wheels=$1
shift
if [ ! -d "$wheels" ]; then
    echo "gpu-check: WHEELS_DIR '$wheels' is not a directory; $usage" >&2
    exit 2
fi
shopt -s nullglob
found=("$wheels"/*.whl)
if [ ${#found[@]} -eq 0 ]; then
    echo "gpu-check: no .whl files in '$wheels' (see docs/gpu.md, 'The wheels': what to download)" >&2
    exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
site=${SPECDRAFT_GPU_SITE:-/tmp/specdraft-site}
python=${PYTHON:-python3}

if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "gpu-check: '$python' cannot import torch; the check uses the machine's own torch build" >&2
    exit 2
fi
# --no-deps: torch and the rest are the machine's own; --upgrade: a rerun replaces the previous install.
"$python" -m pip install -q --no-index --no-deps --upgrade --target "$site" "${found[@]}"
# Installed as a user installs it (the layouts and templates as package data), not run from the checkout.
# --no-build-isolation: no network for a build environment.
"$python" -m pip install -q --no-index --no-deps --upgrade --no-build-isolation --target "$site" "$root"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$site/bin:$PATH"
cd "$root"
exec "$python" benchmarks/gpu_check.py "$@"
