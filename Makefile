# The README's two commands: `make serve` (the main job, embedded defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTRITON := nvidia-pytriton==0.7.0

.PHONY: install serve test lint loadtest clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps $(PYTRITON)
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (apt)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/hps demo --dir demo
	$(BIN)/hps serve --config demo/ps.json

# Load test of the demo model on this machine (docs/loadtest.md); e.g.
# make loadtest LOADTEST_ARGS="--shape ramp --users 64 --run-time 160 --updates 10000"
LOADTEST_ARGS ?= --run-time 60 --updates 1000
loadtest: $(STAMP)
	$(BIN)/hps demo --dir demo
	$(BIN)/hps loadtest --config demo/ps.json $(LOADTEST_ARGS)

test: $(STAMP)
	$(BIN)/ruff check hps tests model_repository loadtests
	$(BIN)/mypy hps
	$(BIN)/pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy hps

clean:
	rm -rf $(VENV) demo .pytest_cache loadtest-reports
