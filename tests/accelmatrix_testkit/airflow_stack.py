"""AirflowStack: a real Airflow 3 (scheduler, dag-processor, triggerer, api-server) for tests.

LocalExecutor on SQLite in a throw-away AIRFLOW_HOME, every component a separate process in
its own session (process group). Everything the test does goes through the public REST API
(``/api/v2``), as an operator or the UI would::

    with AirflowStack(home=tmp, dags_folder=ROOT / "dags", suites_dir=...) as stack:
        stack.create_pool("accelmatrix_cpu_small", 4, include_deferred=True)
        run_id = stack.trigger("local_smoke", conf={"cells": ["model=tiny-mlp,*"]})
        assert stack.wait_for_run("local_smoke", run_id, timeout=900) == "failed"
        tis = stack.task_instances("local_smoke", run_id)
        text = stack.task_log("local_smoke", run_id, "cpu-small.run", map_index=0)

Auth: the stack runs Airflow's simple auth manager with
``[core] simple_auth_manager_all_admins = True``. Its middleware attaches an admin JWT to
every request, so the REST client sends no credentials at all. With ``all_admins=False`` the
stack instead logs in as ``admin`` (``POST /auth/token`` with the password Airflow writes to
``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``) and sends the JWT as a bearer
token.

Stopping (on exit, also after an exception): SIGTERM to every component's process group and
to every descendant seen (task runners live in process groups of their own), up to
``stop_grace`` seconds, then SIGKILL. Then a sweep: any process still carrying this stack's
marker variable (``ACCELMATRIX_STACK_ID``, inherited by everything the components start,
including local workloads) is killed by PID. Nothing else is ever signalled.

Settings that differ from Airflow's defaults (all overridable through ``env_extra``): the
api-server on 127.0.0.1 and a free port (``[api] base_url`` and ``[core]
execution_api_server_url`` point at it); scheduler and triggerer with ``--skip-serve-logs``
(every component shares this home's log folder, so the api-server reads worker and trigger
logs from disk and nothing binds 0.0.0.0); ``[dag_processor] refresh_interval`` 5 s so new
files are seen quickly but ``min_file_process_interval`` 120 s so re-parsing does not compete
with tasks; a 20 s SQLite busy timeout and a 30 s execution-API timeout for task processes;
fixed secret and JWT keys shared by every component.

Resource figures: a sampler thread records the memory of each component's process tree
(RSS of the scheduler process, PSS summed over trees); ``measure()`` gives CPU seconds
(``/proc`` utime+stime through psutil, including reaped children) and peak memory over a
window, e.g. one DAG run.

``executor="PreloadedLocalExecutor"``: the LocalExecutor subclass ``make standalone`` runs,
which imports the task side before forking its workers (``accelmatrix.deploy.executor``).

CeleryExecutor (``executor="CeleryExecutor"``, the docker-compose.yaml deployment): the
metadata DB is ``database_url`` (PostgreSQL; see ``accelmatrix_testkit.services``), the broker
``celery_broker_url`` (Redis) and the result backend ``db+<database_url>`` on the same
database unless given. ``celery_workers`` ``airflow celery worker`` processes start beside the
other components, with ``--skip-serve-logs`` (they write to the shared log folder like every
other component), distinct Celery node names ``celery-<i>@<host>`` and the same name as the
task instances' ``hostname`` (``[core] hostname_callable``), so a test can see which worker
ran a task. They are components like the others: stopped, swept and measured. Their Celery
configuration is ``accelmatrix.deploy.celery_config`` (each worker preloads the task side before
its pool forks, as docker-compose.yaml deploys it) unless ``celery_preload=False``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil

from accelmatrix.settings import REPO_ROOT

TESTS_DIR = Path(__file__).resolve().parents[1]  # holds this package: tests/accelmatrix_testkit

COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
# Name -> [core] executor. PreloadedLocalExecutor is a LocalExecutor whose forked task
# processes start with accelmatrix and Great Expectations imported (accelmatrix.deploy.executor).
EXECUTORS = {
    "LocalExecutor": "LocalExecutor",
    "PreloadedLocalExecutor": "accelmatrix.deploy.executor.PreloadedLocalExecutor",
    "CeleryExecutor": "CeleryExecutor",
}
# What the 3.3.2 scheduler logs when it fails a task whose deferral exit it learns about
# only after the trigger already resumed it (apache/airflow#67287, #71580, #72716).
STALE_SUCCESS = "finished with state success, but the task instance's state attribute is"
_STALE_SUCCESS_RE = re.compile(
    r"reported that the task instance <TaskInstance: [^>\n]*ti_id=([0-9a-f-]+)> "
    + re.escape(STALE_SUCCESS)
)
FINISHED = ("success", "failed")
MARKER = "ACCELMATRIX_STACK_ID"


# Handed to every component as [database] sql_alchemy_connect_args (an import path): SQLite
# waits this long for a lock instead of Python's default 5 s. On 2 busy CPUs the scheduler,
# dag-processor, api-server and triggerer writing at once exceeded 5 s at parallelism 16-32
# ("database is locked" crashed the scheduler). Task processes wait for the api-server, so
# [workers] execution_api_timeout is raised above this (its default of 5 s failed a task).
SQLITE_CONNECT_ARGS: dict[str, Any] = {"timeout": 20}
EXECUTION_API_TIMEOUT = 30

# `airflow db migrate` of a fresh SQLite file costs ~13 s of CPU here, once per stack, and a
# test session starts a dozen stacks. The first stack of a process migrates; the next ones
# with the same extra Airflow settings start from a copy of its database as it was right
# after the migration (sqlite3's online backup: consistent, write-ahead log included). A
# stack on PostgreSQL always migrates.
_MIGRATED: dict[str, Path] = {}


class StackError(RuntimeError):
    """The stack could not start, a component died, or a REST call failed."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the api-server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


# -- resource accounting ------------------------------------------------------------------
def _proc_cpu(p: psutil.Process) -> float:
    """utime+stime of ``p`` plus its reaped children (cutime+cstime); 0 when it is gone."""
    try:
        t = p.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


def _tree(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [p, *p.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def tree_cpu_seconds(p: psutil.Process) -> float:
    """CPU seconds of a process tree: every live member plus what each already reaped.

    A reaped process's time is folded into exactly one live ancestor's children times, so
    nothing is counted twice. Time of processes that were re-parented away (a workload
    started in its own session after its task exited) is not included.
    """
    return sum(_proc_cpu(q) for q in _tree(p))


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def _pss(p: psutil.Process) -> int:
    """Proportional set size: forked workers share pages, so summing RSS would overcount."""
    try:
        return p.memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0
    except AttributeError:  # no smaps on this platform
        return _rss(p)


@dataclass
class Usage:
    """CPU seconds and peak memory of the stack over one window (e.g. one DAG run)."""

    wall_seconds: float = 0.0
    # Scheduler main process only (its loop; includes reaped helpers such as serve-logs).
    scheduler_cpu_seconds: float = 0.0
    # Scheduler plus LocalExecutor workers plus the task processes they run.
    scheduler_tree_cpu_seconds: float = 0.0
    # Every component's tree (scheduler, dag-processor, triggerer, api-server).
    total_cpu_seconds: float = 0.0
    component_cpu_seconds: dict[str, float] = field(default_factory=dict)
    # PSS peak of each component's tree (Celery workers included).
    component_peak_pss_mb: dict[str, float] = field(default_factory=dict)
    # Peak memory: RSS of the scheduler main process; PSS summed over the trees (forked
    # workers share pages copy-on-write, a sum of RSS would count them once per process).
    scheduler_peak_rss_mb: float = 0.0
    scheduler_tree_peak_pss_mb: float = 0.0
    total_peak_pss_mb: float = 0.0
    samples: int = 0
    _t0: float = 0.0
    _cpu0: dict[str, float] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class _Sampler(threading.Thread):
    """Samples RSS of the component trees; feeds every open Usage window."""

    def __init__(self, stack: AirflowStack, interval: float):
        super().__init__(name="airflow-stack-sampler", daemon=True)
        self.stack = stack
        self.interval = interval
        self.windows: list[Usage] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def sample(self) -> None:
        trees = {name: _tree(p) for name, p in self.stack._ps.items()}
        sched = trees.get("scheduler") or []
        main = _rss(sched[0]) if sched else 0
        per_bytes = {n: sum(_pss(q) for q in t) for n, t in trees.items()}
        sched_tree = per_bytes.get("scheduler", 0)
        total = sum(per_bytes.values())
        mb = 1024.0 * 1024.0
        per = {n: v / mb for n, v in per_bytes.items()}
        with self.lock:
            for u in self.windows:
                for n, v in per.items():
                    u.component_peak_pss_mb[n] = max(u.component_peak_pss_mb.get(n, 0.0), v)
                u.samples += 1
                u.scheduler_peak_rss_mb = max(u.scheduler_peak_rss_mb, main / mb)
                u.scheduler_tree_peak_pss_mb = max(u.scheduler_tree_peak_pss_mb, sched_tree / mb)
                u.total_peak_pss_mb = max(u.total_peak_pss_mb, total / mb)

    def run(self) -> None:
        # Only while a measure() window is open: reading every process's smaps each second
        # costs CPU that the stack's own processes need on 2 cores, and most tests measure
        # nothing.
        while not self.stopping.wait(self.interval):
            with self.lock:
                measuring = bool(self.windows)
            if measuring:
                with contextlib.suppress(Exception):
                    self.sample()


# -- the stack ----------------------------------------------------------------------------
def by_step_and_cell(tis: list[dict[str, Any]]) -> tuple[dict[tuple[str, Any], dict], str]:
    """Task instances keyed by (step, cell id), and a one-line-each summary for assertions."""
    by = {(ti["task_id"].rsplit(".", 1)[-1], ti["rendered_map_index"]): ti for ti in tis}
    summary = "\n".join(
        f"{k}: {v['state']} try {v['try_number']}" for k, v in sorted(by.items(), key=str)
    )
    return by, summary


class AirflowStack:
    """A real Airflow in ``home`` (LocalExecutor and SQLite unless told); see the module docstring."""

    def __init__(
        self,
        home: Path | str,
        dags_folder: Path | str,
        suites_dir: Path | str | None = None,
        env_extra: dict[str, str] | None = None,
        parallelism: int = 8,
        *,
        port: int | None = None,
        all_admins: bool = True,
        startup_timeout: float = 240.0,
        stop_grace: float = 10.0,
        sample_interval: float = 1.0,
        airflow_bin: Path | str | None = None,
        components: tuple[str, ...] = COMPONENTS,
        executor: str = "LocalExecutor",
        database_url: str | None = None,
        celery_broker_url: str | None = None,
        celery_result_backend: str | None = None,
        celery_workers: int = 2,
        celery_concurrency: int = 4,
        celery_preload: bool = True,
    ):
        self.home = Path(home).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.suites_dir = Path(suites_dir).resolve() if suites_dir else None
        self.parallelism = parallelism
        unknown = set(components) - set(COMPONENTS) - {"api-server"}
        if unknown or "api-server" not in components:
            raise ValueError(f"components: a subset of {COMPONENTS} with the api-server")
        # A subset (e.g. api-server + dag-processor) tests the REST API in seconds less.
        self.components = tuple(c for c in COMPONENTS if c in components)
        self.port = port or free_port()
        if executor not in EXECUTORS:
            raise ValueError(f"executor: one of {tuple(EXECUTORS)}, not {executor!r}")
        self.executor = executor
        self.database_url = database_url or f"sqlite:///{self.home / 'airflow.db'}"
        self.celery_worker_names: tuple[str, ...] = ()
        if executor == "CeleryExecutor":
            if not celery_broker_url:
                raise ValueError("executor CeleryExecutor needs celery_broker_url (redis://...)")
            if self.database_url.startswith("sqlite"):
                raise ValueError("executor CeleryExecutor needs a PostgreSQL database_url")
            if celery_workers < 1 or celery_concurrency < 1:
                raise ValueError("celery_workers and celery_concurrency must be >= 1")
            self.celery_worker_names = tuple(f"celery-{i}" for i in range(1, celery_workers + 1))
        self.celery_broker_url = celery_broker_url
        self.celery_result_backend = celery_result_backend or _db_result_backend(self.database_url)
        self.celery_concurrency = celery_concurrency
        self.celery_preload = celery_preload
        self.all_admins = all_admins
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.airflow_bin = str(airflow_bin or _default_airflow_bin())
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.logs_dir = self.home / "logs"
        self.accel_home = self.home / "accelmatrix"
        self.stack_id = secrets.token_hex(8)
        self.env = self._build_env(env_extra or {})
        # Stacks whose extra Airflow settings match share one migrated database (_migrate).
        self._migrate_key = json.dumps(
            sorted((k, v) for k, v in (env_extra or {}).items() if k.startswith("AIRFLOW"))
        )
        self.procs: dict[str, subprocess.Popen] = {}
        self._ps: dict[str, psutil.Process] = {}
        self._seen: dict[int, psutil.Process] = {}  # every descendant observed, by pid
        self._stopped: dict[str, list[str]] = {}  # argv of components stop_component stopped
        self._ready_dags: set[str] = set()
        self._client: httpx.Client | None = None
        self._sampler = _Sampler(self, sample_interval)
        self.leftovers: list[int] = []
        self.killed: list[str] = []  # what needed SIGKILL at the last stop
        self.migrate_seconds = self.startup_seconds = self.stop_seconds = 0.0

    # -- environment ------------------------------------------------------------------------
    def _build_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW", "_AIRFLOW", "ACCELMATRIX_"))
            and k not in ("PYTHONPATH", "GX_ANALYTICS_ENABLED")
        }
        plugins = REPO_ROOT / "plugins"
        # The test kit (this package) is not part of accelmatrix: the components import it
        # from tests/ (the SQLite connect args below, a Celery worker's hostname callable).
        pythonpath = [str(plugins), str(TESTS_DIR)]
        if os.environ.get("PYTHONPATH"):
            pythonpath.append(os.environ["PYTHONPATH"])
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                "AIRFLOW__CORE__EXECUTOR": EXECUTORS[self.executor],
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(self.all_admins),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT),
                # As deployed (docker-compose.yaml, make standalone): the 3.3.2 supervisor can
                # miss its task process's exit and sleep this long before freeing the slot.
                "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
                # As deployed too: Execution API calls wait out an api-server restart.
                "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "12",
                "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "3",
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_dir),
                # Nothing serves logs (every component shares this home's log folder); give the
                # ports unique values anyway so a log fetch can never reach another stack.
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__API__BASE_URL": f"{self.base_url}/",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__MAXIMUM_PAGE_LIMIT": "1000",
                # Fixed up front so every component signs and verifies with the same keys even
                # if they start before airflow.cfg exists.
                "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(24),
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                # New files show up within seconds; unchanged files are re-parsed rarely so
                # parsing does not compete with the tasks on a 2-core machine.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",
                "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "ACCELMATRIX_HOME": str(self.accel_home),
                "PYTHONPATH": os.pathsep.join(pythonpath),
                "GX_ANALYTICS_ENABLED": "false",
                MARKER: self.stack_id,
            }
        )
        if self.database_url.startswith("sqlite"):
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{__name__}.SQLITE_CONNECT_ARGS"
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = (
                f"{__name__}.SQLITE_CONNECT_ARGS"
            )
        if self.executor == "CeleryExecutor":
            env.update(
                {
                    "AIRFLOW__CELERY__BROKER_URL": str(self.celery_broker_url),
                    "AIRFLOW__CELERY__RESULT_BACKEND": self.celery_result_backend,
                    "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.celery_concurrency),
                    # One message at a time per free slot: tasks spread over the workers.
                    "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
                }
            )
            if self.celery_preload:  # as docker-compose.yaml deploys it
                env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] = (
                    "accelmatrix.deploy.celery_config.CELERY_CONFIG"
                )
        if self.suites_dir:
            env["ACCELMATRIX_SUITES_DIR"] = str(self.suites_dir)
        env.update(extra)
        return env

    def _worker_env(self, name: str) -> dict[str, str]:
        """A Celery worker's environment: the stack's, plus its own task hostname."""
        from accelmatrix_testkit.hostname import ENV

        env = dict(self.env)
        env.setdefault(
            "AIRFLOW__CORE__HOSTNAME_CALLABLE", "accelmatrix_testkit.hostname.worker_hostname"
        )
        env[ENV] = f"{name}@{socket.gethostname()}"
        return env

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> AirflowStack:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.stop()
        except StackError as e:
            if exc_type is None:
                raise
            # Do not hide the exception that ended the block; report the leftovers beside it.
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.accel_home.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._migrate()
        self.migrate_seconds = time.monotonic() - t0
        commands = {
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],
            "api-server": ["api-server", "--port", str(self.port), "--host", "127.0.0.1"],
        }
        for name in self.components:
            self._spawn(name, [self.airflow_bin, *commands[name]])
        self._start_celery_workers()
        self._sampler.start()
        self._wait_healthy()
        self._wait_celery_workers()
        self.startup_seconds = time.monotonic() - t0

    def _migrate(self) -> None:
        db = self.home / "airflow.db"
        # Only a new database: a stack started again on its home keeps its data.
        own_sqlite = self.database_url == f"sqlite:///{db}" and not db.exists()
        if own_sqlite and (template := _MIGRATED.get(self._migrate_key)) is not None:
            _sqlite_copy(template, db)
            return
        migrate = self.airflow("db", "migrate", timeout=300)
        if migrate.returncode != 0:
            raise StackError(f"airflow db migrate failed:\n{migrate.stdout}\n{migrate.stderr}")
        if own_sqlite:
            template = Path(tempfile.mkdtemp(prefix="accelmatrix-migrated-")) / "airflow.db"
            _sqlite_copy(db, template)
            atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
            _MIGRATED[self._migrate_key] = template

    def _start_celery_workers(self) -> None:
        for name in self.celery_worker_names:
            env = self._worker_env(name)
            cmd = [
                self.airflow_bin,
                "celery",
                "worker",
                "--celery-hostname",
                env["ACCELMATRIX_WORKER_HOSTNAME"],
                "--concurrency",
                str(self.celery_concurrency),
                "--skip-serve-logs",
            ]
            self._spawn(name, cmd)

    def _wait_celery_workers(self) -> None:
        """Wait until every worker logged Celery's ``<node> ready.`` (it consumes the queue)."""
        deadline = time.monotonic() + self.startup_timeout
        pending = set(self.celery_worker_names)
        while pending:
            self.check_alive()
            for name in list(pending):
                log = self.logs_dir / f"{name}.log"
                with contextlib.suppress(OSError):
                    if " ready." in log.read_text(errors="replace"):
                        pending.discard(name)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"Celery workers {sorted(pending)} not ready in {self.startup_timeout} s:\n"
                    + "\n".join(_tail(self.logs_dir / f"{n}.log") for n in sorted(pending))
                )
            time.sleep(0.5)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                r = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
                last = r.text
                if r.status_code == 200:
                    h = r.json()
                    wanted = ["metadatabase"] + [
                        c.replace("-", "_") for c in self.components if c != "api-server"
                    ]
                    if all((h.get(k) or {}).get("status") == "healthy" for k in wanted):
                        self._client = self._make_client()
                        return
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(1)
        raise StackError(f"Airflow did not become healthy in {self.startup_timeout} s: {last}")

    def _make_client(self) -> httpx.Client:
        headers = {"Accept": "application/json"}
        if not self.all_admins:
            headers["Authorization"] = f"Bearer {self._login()}"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def _login(self) -> str:
        pw_file = self.home / "simple_auth_manager_passwords.json.generated"
        passwords = json.loads(pw_file.read_text())
        r = httpx.post(
            f"{self.base_url}/auth/token",
            json={"username": "admin", "password": passwords["admin"]},
            timeout=30,
        )
        if r.status_code >= 300:
            raise StackError(f"login failed: {r.status_code} {r.text}")
        return r.json()["access_token"]

    def check_alive(self) -> None:
        """Raise StackError (with the log tail) when a component has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(
                    f"airflow {name} exited with {proc.returncode}; last lines of "
                    f"{self.logs_dir / (name + '.log')}:\n{_tail(self.logs_dir / (name + '.log'))}"
                )

    # -- one component (fault injection) ----------------------------------------------------
    def stop_component(self, name: str, sig: int = signal.SIGTERM, grace: float = 30.0) -> int:
        """Stop one component (its process group) as an operator or a crash would; its
        return code. Task processes it started live in groups of their own and are left
        alone (they are remembered, so ``stop()`` still ends them). SIGKILL after ``grace``.
        """
        proc = self.procs.get(name)
        if proc is None:
            raise StackError(f"no running component {name!r} (running: {sorted(self.procs)})")
        self._remember_descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self._stopped[name] = list(proc.args)  # type: ignore[arg-type]
        del self.procs[name]
        self._ps.pop(name, None)
        return proc.returncode

    def start_component(self, name: str, timeout: float | None = None) -> None:
        """Start a component ``stop_component`` stopped, with the same command; wait healthy."""
        argv = self._stopped.pop(name, None)
        if argv is None:
            raise StackError(f"component {name!r} was not stopped by stop_component")
        self._spawn(name, argv)
        if self._client is not None:
            self._client.close()  # _wait_healthy makes a new one
            self._client = None
        saved = self.startup_timeout
        self.startup_timeout = timeout or saved
        try:
            self._wait_healthy()
        finally:
            self.startup_timeout = saved

    def start_another(self, name: str, like: str) -> None:
        """Start one more process of the component ``like`` under the name ``name`` (e.g. a
        second triggerer, as Airflow's HA runs them), with the same command and settings;
        ``stop_component(name)`` and ``stop()`` end it like the others."""
        if name in self.procs or name in COMPONENTS:
            raise StackError(f"{name!r} is already a component name")
        self._spawn(name, self._argv(like))

    def revive_exited(self) -> list[str]:
        """Start again, with the same command, every component whose process has exited, as
        a supervisor does (docker-compose's ``restart: always``, a Kubernetes Deployment);
        returns ``"name (exit N)"`` for each."""
        revived = []
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            self._remember_descendants()
            self._spawn(name, list(proc.args))  # type: ignore[arg-type]
            revived.append(f"{name} (exit {proc.returncode})")
        return revived

    def _spawn(self, name: str, argv: list[str]) -> None:
        """Start component ``name`` with ``argv`` in a session of its own, logging to
        ``<logs>/<name>.log`` (appended: a restarted component keeps one log)."""
        env = self._worker_env(name) if name in self.celery_worker_names else self.env
        out = open(self.logs_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(  # noqa: S603 (argv list, no shell)
            argv,
            env=env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.procs[name] = proc
        self._ps[name] = psutil.Process(proc.pid)

    def _argv(self, name: str) -> list[str]:
        """The command line component ``name`` runs (or ran, if it is stopped now)."""
        if name in self.procs:
            return list(self.procs[name].args)  # type: ignore[arg-type]
        if name in self._stopped:
            return list(self._stopped[name])
        raise StackError(f"no component {name!r} (running: {sorted(self.procs)})")

    def restart_component(self, name: str, down_seconds: float = 0.0) -> None:
        """Stop one component, stay down ``down_seconds``, start it again."""
        self.stop_component(name)
        time.sleep(down_seconds)
        self.start_component(name)

    def stop(self) -> None:
        """Stop everything this stack started; SIGKILL after ``stop_grace`` seconds."""
        self._sampler.stopping.set()
        if self._client is not None:
            self._client.close()
            self._client = None
        if not self.procs:
            return
        self._remember_descendants()
        marked = self._marked_processes()
        targets = {p.pid: p for p in [*self._seen.values(), *marked]}
        for proc in self.procs.values():
            targets.pop(proc.pid, None)
        # TERM: each component's whole group, and every descendant (task runners and local
        # workloads run in groups of their own).
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for p in targets.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.terminate()
        t0 = time.monotonic()
        deadline = t0 + self.stop_grace
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in self.procs.values()) and not any(
                _alive(p) for p in targets.values()
            ):
                break
            time.sleep(0.2)
        # KILL what is left: the groups (by their leader's pid, which we started) and stragglers.
        self.killed = [n for n, proc in self.procs.items() if proc.poll() is None]
        self.killed += [
            f"pid {p.pid}" for p in [*targets.values(), *self._marked_processes()] if _alive(p)
        ]
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for p in [*targets.values(), *self._marked_processes()]:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        time.sleep(0.2)
        self.leftovers = sorted(
            {p.pid for p in targets.values() if _alive(p)}
            | {proc.pid for proc in self.procs.values() if proc.poll() is None}
            | {p.pid for p in self._marked_processes()}
        )
        self.stop_seconds = time.monotonic() - t0
        self.procs.clear()
        self._ps.clear()
        if self.leftovers:
            raise StackError(f"processes still alive after SIGKILL: {self.leftovers}")

    def _remember_descendants(self) -> None:
        for p in self._ps.values():
            for q in _tree(p)[1:]:
                self._seen.setdefault(q.pid, q)

    def _marked_processes(self) -> list[psutil.Process]:
        """Live processes whose environment carries this stack's marker (ours, transitively)."""
        found = []
        me = os.getpid()
        for p in psutil.process_iter():
            if p.pid == me:
                continue
            try:
                if p.environ().get(MARKER) == self.stack_id and _alive(p):
                    found.append(p)
            except (psutil.Error, OSError):
                continue
        return found

    # -- CLI and REST -----------------------------------------------------------------------
    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run an ``airflow`` CLI command with the stack's environment."""
        return subprocess.run(  # noqa: S603 (argv list, no shell)
            [self.airflow_bin, *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            raise StackError("the stack is not running")
        return self._client

    def api(self, method: str, path: str, *, ok: tuple[int, ...] = (), **kwargs: Any) -> Any:
        """Call the REST API (path relative to /api/v2); JSON of the answer or StackError."""
        url = f"/api/v2/{path.lstrip('/')}"
        # Reads are retried: on SQLite the api-server answers 500 while another component
        # holds the write lock for long.
        attempts = 5 if method.upper() == "GET" else 1
        for attempt in range(attempts):
            try:
                r = self.client.request(method, url, **kwargs)
            except httpx.TransportError:
                if attempt == attempts - 1:
                    raise
                time.sleep(2)
                continue
            if r.status_code < 500 or attempt == attempts - 1:
                break
            time.sleep(2)
        if r.status_code >= 300 and r.status_code not in ok:
            raise StackError(f"{method} {path} -> {r.status_code}: {r.text[:2000]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            return r.text

    # -- pools, DAGs, runs ------------------------------------------------------------------
    def create_pool(
        self, name: str, slots: int, include_deferred: bool = True, description: str = ""
    ) -> dict[str, Any]:
        """Create or update a pool (REST)."""
        body = {
            "name": name,
            "slots": slots,
            "description": description or "accelmatrix test pool",
            "include_deferred": include_deferred,
        }
        r = self.client.post("/api/v2/pools", json=body)
        if r.status_code == 409:
            return self.api("PATCH", f"pools/{quote(name, safe='')}", json=body)
        if r.status_code >= 300:
            raise StackError(f"POST pools -> {r.status_code}: {r.text[:2000]}")
        return r.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; unpause it."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            r = self.client.get(f"/api/v2/dags/{quote(dag_id, safe='')}")
            if r.status_code == 200:
                break
            if time.monotonic() > deadline:
                errors = self.api("GET", "importErrors", params={"limit": 100})
                raise StackError(
                    f"DAG {dag_id} not parsed after {timeout} s; import errors: "
                    f"{json.dumps(errors, indent=1)[:4000]}"
                )
            time.sleep(1)
        dag = self.api("PATCH", f"dags/{quote(dag_id, safe='')}", json={"is_paused": False})
        self._ready_dags.add(dag_id)
        return dag

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a manual run (logical_date null); return its run id."""
        if dag_id not in self._ready_dags:
            self.wait_for_dag(dag_id)
        run = self.api(
            "POST",
            f"dags/{quote(dag_id, safe='')}/dagRuns",
            json={"logical_date": None, "conf": conf or {}},
        )
        return run["dag_run_id"]

    def backfill(
        self, dag_id: str, first: str, last: str, conf: dict[str, Any], attempts: int = 5
    ) -> subprocess.CompletedProcess:
        """``airflow backfill create`` of the dates ``first`` to ``last`` (YYYY-MM-DD), one run
        at a time, with ``conf``; the CLI's answer (returncode 0 when created).

        The runs are created while the scheduler is down: ``backfill create`` inserts them
        one savepoint at a time, and on the SQLite metadata DB a savepoint that reads and
        then writes while the scheduler holds the write lock gets "database is locked" at
        once (SQLite refuses to wait where waiting could deadlock). The scheduler starts
        again right after and schedules them. One run at a time: with several backfill runs
        at once on SQLite, Airflow 3.3.2's scheduler can die on a dag_run UPDATE that
        matched no row (StaleDataError)."""
        self.stop_component("scheduler")
        try:
            for _attempt in range(attempts):
                created = self.airflow(
                    "backfill", "create", "--dag-id", dag_id, "--from-date", first,
                    "--to-date", last, "--dag-run-conf", json.dumps(conf),
                    "--max-active-runs", "1",
                )  # fmt: skip
                if created.returncode == 0 or "database is locked" not in created.stderr:
                    break
                # Airflow cleans up a half-made backfill after a lock error only on
                # PostgreSQL and MySQL: cancel the orphan so the next attempt may start.
                for bf in self.api("GET", "backfills", params={"dag_id": dag_id})["backfills"]:
                    if bf["completed_at"] is None:
                        self.api("PUT", f"backfills/{bf['id']}/cancel")
                time.sleep(2)
        finally:
            self.start_component("scheduler")
        return created

    def get_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}")

    def wait_for_run(
        self, dag_id: str, run_id: str, timeout: float = 900, poll: float = 1.0
    ) -> str:
        """Wait until the run is success or failed; return that state."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            state = self.get_run(dag_id, run_id)["state"]
            if state in FINISHED:
                return state
            if time.monotonic() > deadline:
                counts: dict[str, int] = {}
                for ti in self.task_instances(dag_id, run_id):
                    counts[str(ti["state"])] = counts.get(str(ti["state"]), 0) + 1
                raise TimeoutError(
                    f"run {dag_id}/{run_id} still {state} after {timeout} s; task states {counts}"
                )
            time.sleep(poll)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run (mapped ones included), as the REST API gives them.

        Each dict has at least task_id, map_index, rendered_map_index, state, start_date,
        end_date, try_number, duration.
        """
        out: list[dict[str, Any]] = []
        path = f"dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        while True:
            page = self.api("GET", path, params={"limit": 1000, "offset": len(out)})
            batch = page["task_instances"]
            out.extend(batch)
            if not batch or len(out) >= page["total_entries"]:
                return out

    def task_log(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int = -1,
        try_number: int = 1,
    ) -> str:
        """The task's log as text: worker lines and the trigger's lines (read from disk by the
        api-server, which globs ``<attempt>.log*`` so ``.trigger.<job>.log`` is included).

        One line per structured record: ``timestamp level [logger] event key=value...``.
        """
        path = (
            f"dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}/logs/{try_number}"
        )
        params: dict[str, Any] = {"map_index": map_index, "full_content": "true"}
        lines: list[str] = []
        for _ in range(50):
            page = self.api("GET", path, params=params)
            content = page.get("content") or []
            lines.extend(_format_record(rec) for rec in content)
            token = page.get("continuation_token")
            if not token or not content:
                break
            params = {"map_index": map_index, "token": token}
        return "\n".join(lines)

    def task_log_once_written(
        self,
        *args: Any,
        line: str,
        after: str | None = None,
        timeout: float = 30.0,
        **kwargs: Any,
    ) -> str:
        """``task_log``, read again until it holds ``line`` or ``timeout`` passes; with
        ``after``, only while the text holds ``after`` (a line only some runs write).

        The triggerer writes a trigger's last lines ("Trigger fired event") to its own log file
        after it has ended the task, so a run can be over before they are on disk: on a busy
        machine a single read can miss them. The caller still asserts on the text.
        """
        deadline = time.monotonic() + timeout
        while True:
            text = self.task_log(*args, **kwargs)
            if line in text or (after is not None and after not in text):
                return text
            if time.monotonic() > deadline:
                return text
            time.sleep(1)

    def stale_success_failures(self) -> set[str]:
        """Ids of task instances the scheduler failed through Airflow's defer/resume race.

        In 3.3.2, when a trigger fires before the scheduler has processed the executor's
        "success" for the attempt that deferred, and the resumed attempt is already queued or
        running, the scheduler takes that stale event for an external kill and fails the task
        (fixed upstream for `scheduled` only). Compare with the ``id`` of task_instances().
        """
        try:
            text = (self.logs_dir / "scheduler.log").read_text(errors="replace")
        except OSError:
            return set()
        return set(_STALE_SUCCESS_RE.findall(text))

    # -- measurement ------------------------------------------------------------------------
    def cpu_seconds(self) -> dict[str, float]:
        """Cumulative CPU seconds: scheduler main process, scheduler tree, each component tree."""
        out = {name: tree_cpu_seconds(p) for name, p in self._ps.items()}
        sched = self._ps.get("scheduler")
        out["scheduler_main"] = _proc_cpu(sched) if sched else 0.0
        self._remember_descendants()
        return out

    @contextlib.contextmanager
    def measure(self) -> Iterator[Usage]:
        """CPU seconds and peak RSS of the stack while the block runs."""
        u = Usage(_t0=time.monotonic(), _cpu0=self.cpu_seconds())
        with self._sampler.lock:
            self._sampler.windows.append(u)
        with contextlib.suppress(Exception):
            self._sampler.sample()
        try:
            yield u
        finally:
            with contextlib.suppress(Exception):
                self._sampler.sample()
            with self._sampler.lock:
                self._sampler.windows.remove(u)
            cpu1 = self.cpu_seconds()
            d = {k: max(0.0, cpu1.get(k, 0.0) - u._cpu0.get(k, 0.0)) for k in cpu1}
            u.wall_seconds = time.monotonic() - u._t0
            u.scheduler_cpu_seconds = d.get("scheduler_main", 0.0)
            u.scheduler_tree_cpu_seconds = d.get("scheduler", 0.0)
            u.component_cpu_seconds = {k: v for k, v in d.items() if k in self._ps}
            u.total_cpu_seconds = sum(u.component_cpu_seconds.values())


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _db_result_backend(database_url: str) -> str:
    """Celery's SQLAlchemy result backend on Airflow's database (``db+postgresql+psycopg2://``).

    The driver stays named: SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3.
    """
    return f"db+{database_url}"


def _default_airflow_bin() -> Path:
    here = Path(sys.executable).with_name("airflow")
    if here.exists():
        return here
    return REPO_ROOT / ".venv" / "bin" / "airflow"


# Printed first, or left out: the context Airflow binds to every record of a task's log.
_RECORD_KEYS = ("timestamp", "level", "logger", "event")
_CONTEXT_KEYS = (
    "ti_id",
    "dag_id",
    "run_id",
    "task_id",
    "map_index",
    "try_number",
    "filename",
    "lineno",
)


def _format_record(rec: Any) -> str:
    if not isinstance(rec, dict):
        return str(rec)
    parts = [str(rec[k]) for k in ("timestamp", "level") if rec.get(k)]
    if rec.get("logger"):
        parts.append(f"[{rec['logger']}]")
    parts.append(str(rec.get("event", "")))
    extra = {k: v for k, v in rec.items() if k not in _RECORD_KEYS + _CONTEXT_KEYS}
    parts.extend(f"{k}={v}" for k, v in extra.items())
    return " ".join(parts)


def _sqlite_copy(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite database (its write-ahead log included)."""
    with (
        contextlib.closing(sqlite3.connect(src)) as a,
        contextlib.closing(sqlite3.connect(dst)) as b,
    ):
        a.backup(b)
