# hybridflow — the README's commands. Every target creates/updates .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO_CUSTOMERS ?= 20000
DEMO_DAYS      ?= 730
PYTEST_ARGS    ?=
# test files run on this many processes (pytest-xdist, one file per process at a time), in the
# order tests/conftest.py gives them (stack tests first), not xdist's (most tests first)
TEST_WORKERS   ?= 2

export PREFECT_HOME ?= $(CURDIR)/.hybridflow/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: install postgres demo test test-fast bench bench-30m lint clean up down

$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is required for Spark: apt-get install openjdk-17-jre-headless"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	@echo "byte-compiling the packages while recording the JVM class archive Spark drivers start from and Prefect's empty database (about 60 s, once)"
	@# pip compiles one file at a time (40 s of its 67 s); like pip, compileall's status is not
	@# checked: files in newer Python syntax (torch's py312 test intrinsics) never compile
	@$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" & compiling=$$!; \
	  $(BIN)/python -m infra.prefect_runtime.database >/dev/null & migrating=$$!; \
	  $(BIN)/hybridflow jvm-archive; recorded=$$?; wait $$migrating; migrated=$$?; wait $$compiling; \
	  test $$migrated = 0 || echo "warning: Prefect's empty database was not recorded (python -m infra.prefect_runtime.database says why): each new Prefect home migrates its own, a slower first start"; \
	  test $$recorded = 0
	@touch $(STAMP)

install: $(STAMP)

# the deployed stack's database (hybridflow up --db postgres, the default): Debian's server
# binaries, installed when missing as the browser test installs chromium
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing PostgreSQL's server binaries (apt-get install postgresql)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } || \
	  { echo "PostgreSQL is missing: apt-get install postgresql (or hybridflow up --db sqlite)"; exit 2; }; }

demo: install
	$(BIN)/hybridflow demo-data --customers $(DEMO_CUSTOMERS) --days $(DEMO_DAYS) --out data/demo-events
	$(BIN)/hybridflow run --events data/demo-events

test: install postgres
	@mkdir -p $(PREFECT_HOME)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m "not integration and not e2e" $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m bench

# issue 34's headline: hybridflow run on 2M customers / 29.9M events against DuckDB + torch, wall and peak RSS
bench-30m: install
	BENCH_RUN_CUSTOMERS=2000000 BENCH_RUN_DAYS=365 $(BIN)/python -m bench run

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

up: install postgres
	$(BIN)/hybridflow up $(UP_ARGS)

down: install
	$(BIN)/hybridflow down

clean:
	rm -rf .hybridflow data tests/output bench/results
