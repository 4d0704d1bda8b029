# The README's two commands: `make serve` (the main job, embedded defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Debian packages the test suite runs (tests/images: podman with runc, mmdebstrap for the
# base; g++ builds the GPU kernel's source for the CPU in tests/unit/cache)
TEST_APT := podman runc mmdebstrap g++

.PHONY: install serve test test-tools lint loadtest model-repository gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# setuptools' editable install warns (a UserWarning) that a folder named hps in the
	@# working directory would shadow the package: true of every editable install, noise here
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[dev]'
	$(BIN)/hps install-triton --force -- -q  # nvidia-pytriton, --no-deps (docs/deploy.md)
	@missing=$$(command -v redis-server >/dev/null || echo redis-server; \
	  [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || echo nginx-light); \
	[ -z "$$missing" ] || { \
	  echo "installing" $$missing "(apt)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; }
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/hps demo --dir demo
	$(BIN)/hps serve --config demo/ps.json

# model_repository/: the demo's Triton models as `hps serve` writes them, regenerated from the
# templates in hps/triton/model/templates/ (tests/unit/triton/test_model_repository.py)
model-repository: $(STAMP)
	$(BIN)/hps repository --out model_repository

test-tools:
	@missing=$$(for c in $(TEST_APT); do command -v $$c >/dev/null || echo $$c; done); \
	[ -z "$$missing" ] || { \
	  echo "installing $$missing (apt)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; }
	@# checkov, in an environment of its own (.venv-tools: tests/helm/tools.py says why)
	$(BIN)/python -c "from tests.helm.tools import checkov; checkov()"

# Load test of the demo model on this machine (docs/loadtest.md); e.g.
# make loadtest LOADTEST_ARGS="--shape ramp --users 64 --run-time 160 --updates 10000"
# A demo of its own: its updates change the L3 they go to, which `make serve`'s demo/ keeps.
LOADTEST_ARGS ?= --run-time 60 --updates 1000
loadtest: $(STAMP)
	$(BIN)/hps demo --dir loadtest-demo
	$(BIN)/hps loadtest --config loadtest-demo/ps.json $(LOADTEST_ARGS)

test: $(STAMP) test-tools
	$(BIN)/ruff check .
	$(BIN)/mypy hps
	$(BIN)/pytest -q --durations=15 tests

# On a node with a GPU and CuPy (the `gpu` extra): the L1 tests on the GPU, then the GPU
# rows of the cache benchmark at the sizes docs/cache.md reports ("GPU kernels"), the
# benchmark even where a test failed (the target fails at the end then). GPU_PYTHON: an
# interpreter with CuPy and what these need: numpy, numba, pydantic, rocksdict, pytest,
# hypothesis (no servers, no Kafka or Redis clients). The NVRTC wheel's test is left out:
# there CuPy compiles the same source with the GPU's own NVRTC. It stops first unless CuPy
# sees a working GPU (else every test would run on NumPy alone and pass). There the tests
# run on each array module (tests/unit/cache/conftest.py), the kernels' included: the
# many-table launch (test_many.py, test_row_formats.py) and the rows kept on the GPU,
# filled and pooled there (test_rows_on_gpu.py), on the GPU's shared device.
GPU_PYTHON ?= $(BIN)/python
gpu-check:
	@$(GPU_PYTHON) -c "from hps.cache.xp import usable_cupy; import sys; \
	  sys.exit(usable_cupy() is None and 'gpu-check: CuPy sees no working GPU')"
	@failed=0; \
	$(GPU_PYTHON) -m pytest -q -p no:cacheprovider tests/unit/cache tests/unit/test_index.py \
	  tests/unit/ctr --ignore=tests/unit/cache/test_kernel_nvrtc.py || failed=1; \
	for dim in 16 64 128 256; do \
	  $(GPU_PYTHON) -m hps.cli bench cache --mode throughput --device cupy --policies lru \
	    --rows 4194304 --dim $$dim --tables 26 --batch-per-table 1024 || failed=1; done; \
	for keys in 2048 262144; do \
	  $(GPU_PYTHON) -m hps.cli bench cache --mode throughput --device cupy --policies lru \
	    --rows 4194304 --dim 128 --tables 1 --batch-per-table $$keys || failed=1; done; \
	exit $$failed

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy hps

clean:
	rm -rf $(VENV) .venv-tools demo .pytest_cache loadtest-reports
