# Every target installs what it needs into .venv first, so a fresh clone needs only these.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run demo-load demo-load-direct test lint bench-overhead clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo: its simulator on 8001, so that demo-load-direct can reach it past the gateway.
run: $(STAMP)
	SLUICEGATE_DEMO_SIM_PORT=8001 $(BIN)/sluicegate serve

# A noisy neighbour against the running demo (watch it at http://127.0.0.1:8000/status), or
# the same load straight to the demo's simulator, without the gateway.
DEMO_LOAD := SLUICEGATE_DEMO_KEY_ALICE=sk-demo-alice SLUICEGATE_DEMO_KEY_BOB=sk-demo-bob \
	$(BIN)/sluicegate bench run src/sluicegate/demo-load.yaml

demo-load: $(STAMP)
	$(DEMO_LOAD) --target http://127.0.0.1:8000/v1 --out bench/results/demo-load

demo-load-direct: $(STAMP)
	$(DEMO_LOAD) --target http://127.0.0.1:8001/v1 --out bench/results/demo-load-direct

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

# Two workers: the suite mostly waits on the processes it starts (docs/development.md, "Tests"). The unit
# suite runs a second time as on a machine booted a minute ago (tests/conftest.py).
test: lint
	$(BIN)/pytest -n 2
	SLUICEGATE_TEST_MONOTONIC_AT=60 $(BIN)/pytest -q tests/unit

bench-overhead: $(STAMP)
	$(BIN)/sluicegate bench overhead

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
