# Quick start:  make demo   (sets up .venv, then runs the main job, jobs/demo.yaml, offline)
#               make test   (sets up .venv, then runs the test suite)
VENV       ?= .venv
PY         := $(VENV)/bin/python
# Where no GPU is present, torch is installed first as a CPU build so that the `torch` range in
# pyproject.toml does not pull a multi-GB CUDA build. Elsewhere set e.g.
# TORCH_CPU_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_CPU  ?= torch==2.13.0
TORCH_CPU_ARGS ?=

.PHONY: setup demo test test-fast bench gpu-check gpu-wheels clean

setup: $(VENV)/.installed

# pip -qq: errors only (a first setup printed ~200 lines of notices and warnings that were not ours).
$(VENV)/.installed: pyproject.toml setup.py pipeline/decoding/engines/decode_attention.c
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -qq --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	    echo "GPU found: installing torch from pyproject's range"; \
	else \
	    echo "No GPU: installing the CPU build ($(TORCH_CPU))"; \
	    $(PY) -m pip install -qq $(TORCH_CPU_ARGS) "$(TORCH_CPU)"; \
	fi
	@echo "Installing bild-pipeline and its dependencies into $(VENV)"
	@$(PY) -m pip install -qq -e ".[dev]"
	@touch $@

# The main job: German -> English with BiLD on the shipped Multi30k model pair, offline, then
# its report (BLEU/chrF against the references, throughput, BiLD behaviour) in runs/demo/report.
# DEMO_SET: job overrides, e.g. make demo DEMO_SET="--set report.baseline_engine=ct2" (the paired
# baseline on CTranslate2).
DEMO_SET ?=
demo: setup
	$(VENV)/bin/bild-pipeline run jobs/demo.yaml $(DEMO_SET)
	$(VENV)/bin/bild-pipeline report runs/demo --out runs/demo/report

# Two workers, each test file on one (its module fixtures and local Ray built once): 9.3 min against
# 14.5 serially on a 2-core machine.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

# The loop for someone changing the decoding or the jobs layer: their tests without Ray and without
# the slow end-to-end cases, on two workers. `make test` (what CI runs) still runs everything.
test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not slow" tests/decoding tests/jobs

bench: setup
	$(VENV)/bin/bild-pipeline bench-loop

# On a machine with an NVIDIA GPU (setup then installs torch's CUDA build): the device tests, then
# bench and bench-batch on the demo pair and on random T5-small/large and NLLB-600M/3.3B shapes;
# writes runs/gpu-check/gpu_check.md and .json. CI runs the same script on the CPU (--quick).
gpu-check: setup
	$(PY) scripts/gpu_check.py --out runs/gpu-check

# The lent GPU machine reaches no package registry, so `make gpu-check` (which starts with setup) cannot
# run there: its own python3 runs scripts/gpu_check.py instead (docs/benchmarking.md has the command).
# That python3 has torch, transformers, pyarrow, sacrebleu, click, pytest, onnxruntime, ... (the tool
# library's device/KINDS.md) and none of ray, pydantic, s3fs, rouge-score, which the check does not
# import. Its transformers has been read as 5.17 and as 6.x (outside our range), so the version we test
# with travels as a wheel: this wheelhouse, in the ignored folder $(GPU_WHEELS), at most 64 MiB.
GPU_WHEELS ?= .whl
gpu-wheels: setup
	@rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	@$(PY) -m pip download -qq --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d $(GPU_WHEELS) "transformers==$$($(PY) -c 'import transformers; print(transformers.__version__)')"
	@du -sm $(GPU_WHEELS) | awk '{ if ($$1 > 64) { print "the wheelhouse is over 64 MiB"; exit 1 } \
	    else print "wheelhouse: " $$1 " MiB in $(GPU_WHEELS):" }' && ls $(GPU_WHEELS)

clean:
	rm -rf $(VENV) build dist *.egg-info pipeline/decoding/engines/_decode_attention*.so
