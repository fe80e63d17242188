# Two commands on a fresh machine:  `make run` (the main job) and `make test` (the test suite).
# Both create or refresh the virtual environment at .venv from the pinned requirements.txt first;
# when it is up to date that step is a file-time check and costs nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.ready

.PHONY: run test test-fast venv clean-venv

run: $(READY)
	$(PY) tools/train_cls.py lvvit_s

# ruff first (pyproject.toml); then every core runs test files (a file's tests stay on one worker: its module
# fixtures are built once), the longest files first (tests/conftest.py's LONGEST_FIRST, in that order); the 40
# slowest tests are listed at the end, the data LONGEST_FIRST is kept up to date from
test: $(READY)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=40

# the edit-run loop: everything but the tests marked slow (a few minutes on 2 cores)
test-fast: $(READY)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder -m "not slow"

venv: $(READY)

# --no-cache-dir: torch's CUDA libraries are about 4 GB of wheels, and a second copy in pip's cache has filled a
# fresh machine's disk before now
$(READY): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --no-build-isolation -e .
	touch $@

clean-venv:
	rm -rf $(VENV)
