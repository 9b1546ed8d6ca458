# Every target installs what it needs into .venv first, so a fresh clone needs only these.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench-overhead clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/sluicegate serve

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

# Two workers: the suite mostly waits on the processes it starts (README, "Development"). The unit
# suite runs a second time as on a machine booted a minute ago (tests/conftest.py).
test: lint
	$(BIN)/pytest -n 2
	SLUICEGATE_TEST_MONOTONIC_AT=60 $(BIN)/pytest -q tests/unit

bench-overhead: $(STAMP)
	$(BIN)/sluicegate bench overhead

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
