# accelmatrix: two commands on a fresh machine.
#   make demo   set up everything and run every example suite of the local backend end to end
#   make test   run the test suite
#   make check  lint and every test that needs no server: the edit loop's quick answer
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin

export AIRFLOW_HOME ?= $(CURDIR)/airflow_home
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export ACCELMATRIX_HOME ?= $(AIRFLOW_HOME)/accelmatrix
export PATH := $(BIN):$(PATH)

.PHONY: venv demo test check reliability lint docs format bench standalone clean

venv: $(VENV)/.installed

# torch first, with pip: the CPU wheel 2.13.0 lies on this machine's disk and pip finds
# it; uv would fetch a multi-GB CUDA build instead. uv then installs the rest fast and
# keeps the torch already there (it satisfies the pin).
# --compile-bytecode: uv writes no .pyc files by default, and where PYTHONDONTWRITEBYTECODE
# is set (CI shells) Python never writes them either: every Airflow, scheduler and task
# process then compiled Airflow and Great Expectations from source (16 s of CPU for the
# great_expectations import alone, against about 2 s compiled).
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==0.13.9
	$(BIN)/pip install -q torch==2.13.0
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/uv pip install -q --compile-bytecode -r requirements.txt -r requirements-dev.txt
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/uv pip install -q --no-deps -e .
	touch $@

$(AIRFLOW_HOME)/.migrated: $(VENV)/.installed
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/db-migrate.log 2>&1
	touch $@

demo: venv $(AIRFLOW_HOME)/.migrated
	$(BIN)/python -m accelmatrix validate
	$(BIN)/python -m accelmatrix pools --apply
	# the "service account" the cluster_validation preflight expects (idempotent)
	$(BIN)/airflow connections get accelmatrix_local_cluster > /dev/null 2>&1 || \
	  $(BIN)/airflow connections add accelmatrix_local_cluster --conn-type generic --conn-host localhost > /dev/null
	$(BIN)/python -m accelmatrix.demo

# .ci/test-deps installs the Debian packages the SSH, browser and Celery tests need when they
# are missing (as root or with sudo; ACCELMATRIX_NO_APT=1 to never install). A run that still
# had to skip a group of tests says so at the end (tests/conftest.py).
# TEST_WORKERS pytest-xdist processes run the suite, one test file each at a time (a file's
# tests share its fixtures). Most long tests wait on an Airflow scheduler, a workload or an
# emulator's delay, so a third worker fills the time the cores would sit idle: 923 s with 3
# against 1,054 s with 2 for the 888 tests, both beside other test runs
# (docs/performance.md, "Three workers, and the fault matrix on two stacks"). Each worker
# may run an Airflow of its own (~1.7 GB of memory; 3 workers: 6 GB used of 24 when
# sampled); TEST_WORKERS=0 runs the suite in one process.
# --no-loadscope-reorder: xdist would otherwise hand out the files with the most tests
# first, which put the longest ones (one to six tests each) last, with one worker idle
# for ~10 minutes at the end; tests/conftest.py orders the files longest first instead.
TEST_WORKERS ?= 3
test: venv
	.ci/test-deps
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Lint, then every test that needs no server (no sshd, PostgreSQL, Redis, Chromium, cloud
# emulator, gcloud, kubectl, Airflow metadata DB or scheduler: tests/conftest.py marks the
# others `server` from the fixtures they use). No .ci/test-deps: nothing here needs a
# package beyond the venv. The tests are spread one by one over the workers (no
# --dist loadfile: few of them share a module fixture). `make test` runs these too.
CHECK_WORKERS ?= 2
check: lint
	$(BIN)/pytest -q -n $(CHECK_WORKERS) -m "not server and not reliability and not loop"

# The fault-injection matrix on a real Airflow (every backend): writes the faults x backends
# table (docs/reliability.md) to reliability-table.md and prints it. Two pytest-xdist
# workers, a stack each (--dist loadgroup, the tests' xdist_group marks): one runs the
# per-cell faults and the cloud-API outage, then the metadata DB restarted mid-run on a
# Celery stack of its own; the other the other run-level faults, one after another. 9-11
# min here (19 min beside another make test); docs/performance.md, "Three workers, and
# the fault matrix on two stacks".
# ACCELMATRIX_REQUIRE_SERVERS: a missing sshd (or any server) fails the run instead of skipping.
RELIABILITY_WORKERS ?= 2
reliability: venv
	.ci/test-deps
	rm -f $(CURDIR)/reliability-table.md
	ACCELMATRIX_REQUIRE_SERVERS=1 ACCELMATRIX_FAULT_TABLE=$(CURDIR)/reliability-table.md \
		$(BIN)/pytest -q -n $(RELIABILITY_WORKERS) --dist loadgroup --no-loadscope-reorder \
		-m reliability tests/test_fault_matrix.py tests/test_metadata_db_restart.py; \
		rc=$$?; cat $(CURDIR)/reliability-table.md 2>/dev/null; exit $$rc

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(CURDIR)/site

# The documentation site (docs/, mkdocs.yml) into site/: open site/index.html.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(CURDIR)/site

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: venv $(AIRFLOW_HOME)/.migrated
	$(BIN)/python bench/bench_parse.py
	$(BIN)/python bench/bench_evaluation.py

# `airflow standalone` run by accelmatrix.deploy.standalone, which also stops on SIGTERM: Airflow's
# stops its components only on Ctrl-C, and a SIGTERM (to it, or to this make) left them all
# running (docs/deploy.md, "make standalone").
# The executor: a LocalExecutor whose task processes start with accelmatrix and Great
# Expectations imported (plugins/accelmatrix/deploy/executor.py), unless you chose another one.
# [core] parallelism: LocalExecutor forks that many workers at start, each runs one task at
# a time. 4 per CPU, at most Airflow's default of 32: 8 on 2 cores, where BENCHMARKS.md
# measured it. Set AIRFLOW__CORE__PARALLELISM (or STANDALONE_PARALLELISM) to change it.
# [workers] min_heartbeat_interval 1: Airflow 3.3.2's task supervisor can miss its task's
# exit and then sleep this long (default 5 s) before it frees the slot (docs/deploy.md).
STANDALONE_PARALLELISM ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n * 4 < 32 ? n * 4 : 32 )))
standalone: venv $(AIRFLOW_HOME)/.migrated
	$(BIN)/python -m accelmatrix pools --apply
	AIRFLOW__CORE__EXECUTOR=$${AIRFLOW__CORE__EXECUTOR:-accelmatrix.deploy.executor.PreloadedLocalExecutor} \
	AIRFLOW__CORE__PARALLELISM=$${AIRFLOW__CORE__PARALLELISM:-$(STANDALONE_PARALLELISM)} \
	AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=$${AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL:-1} \
	AIRFLOW__WORKERS__EXECUTION_API_RETRIES=$${AIRFLOW__WORKERS__EXECUTION_API_RETRIES:-12} \
	AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN=$${AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN:-3} \
		$(BIN)/python -m accelmatrix.deploy.standalone

clean:
	rm -rf $(AIRFLOW_HOME)
