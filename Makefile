# Quick start:  make demo   (sets up .venv, then runs the main job offline)
#               make test   (sets up .venv, then runs the test suite)
VENV       ?= .venv
PY         := $(VENV)/bin/python
# Where no GPU is present, torch is installed first as a CPU build so that the `torch` range in
# pyproject.toml does not pull a multi-GB CUDA build. Elsewhere set e.g.
# TORCH_CPU_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_CPU  ?= torch==2.13.0
TORCH_CPU_ARGS ?=

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	    echo "GPU found: installing torch from pyproject's range"; \
	else \
	    echo "No GPU: installing the CPU build ($(TORCH_CPU))"; \
	    $(PY) -m pip install -q $(TORCH_CPU_ARGS) "$(TORCH_CPU)"; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# Until the embedded demo pair ships, the main command builds a tiny random T5 pair locally
# (no download) and decodes one sentence with BiLD, printing the output and its statistics.
DEMO_PAIR ?= runs/tiny-t5
demo: setup
	test -d $(DEMO_PAIR)/large || $(VENV)/bin/bild-pipeline tiny-pair $(DEMO_PAIR) --family t5
	$(VENV)/bin/bild-pipeline generate --small $(DEMO_PAIR)/small --large $(DEMO_PAIR)/large \
	    --method bild --max-new-tokens 32 "Ein Hund läuft."

test: setup
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/bild-pipeline bench-loop

clean:
	rm -rf $(VENV) build *.egg-info
