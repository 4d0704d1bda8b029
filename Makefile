# The README's two commands: `make serve` (the main job, embedded defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install serve test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/hps install-triton --force -- -q  # nvidia-pytriton, --no-deps (docs/deploy.md)
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (apt)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/hps demo --dir demo
	$(BIN)/hps serve --config demo/ps.json

test: $(STAMP)
	$(BIN)/ruff check hps tests
	$(BIN)/mypy hps
	$(BIN)/pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy hps

clean:
	rm -rf $(VENV) demo .pytest_cache
