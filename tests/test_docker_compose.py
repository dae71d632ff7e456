"""The production stack (docker-compose.yaml + Dockerfile), checked without a Docker engine.

The compose file is parsed with PyYAML (whose SafeLoader resolves the `<<` merge keys the
file uses) and `${VAR...}` references are expanded by a small re-implementation of
compose's interpolation, so URLs can be parsed and required variables checked.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ENV_EXAMPLE = ROOT / ".env.example"
REQUIREMENTS = ROOT / "requirements.txt"
POSTGRES_INIT_DIR = ROOT / "docker" / "postgres-init"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

BASE_IMAGE = "apache/airflow:3.3.2-python3.11"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
LONG_RUNNING_AIRFLOW_SERVICES = tuple(s for s in AIRFLOW_SERVICES if s != "airflow-init")
REQUIRED_SERVICES = ("postgres", "redis", *AIRFLOW_SERVICES)
SOURCE_MOUNTS = {
    "./dags": "/opt/airflow/dags",
    "./plugins": "/opt/airflow/plugins",
    "./include": "/opt/airflow/include",
    "./config": "/opt/airflow/config",
}

# Variables whose values are secrets: each must be required (`${VAR:?msg}`), never given a
# default in the compose file. Passwords with a documented development default would be
# listed in DOCUMENTED_DEV_DEFAULTS (name -> value) and in docs/deploy.md; there are none.
SECRET_VARIABLES = {
    "POSTGRES_PASSWORD",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_ADMIN_PASSWORD",
}
DOCUMENTED_DEV_DEFAULTS: dict[str, str] = {}
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|FERNET|TOKEN|PRIVATE_KEY|API_KEY", re.I)

# LocalBackend strips these from the environment it hands to workloads; a secret may only
# reach a long-running service under such a name (see test_workloads_never_see_secrets).
WORKLOAD_HIDDEN_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "_AIRFLOW")
WORKLOAD_HIDDEN_NAMES = {"ACCELMATRIX_RESULTS_URL"}


# --------------------------------------------------------------------------- interpolation

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(KeyError):
    pass


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Expand `$$`, `$VAR`, `${VAR}`, `${VAR:-d}`, `${VAR-d}`, `${VAR:?m}`, `${VAR?m}`, `${VAR:+x}`."""

    def expand(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["braced"] or m["bare"]
        op, arg = m["op"], m["arg"] or ""
        is_set = name in env
        is_nonempty = bool(env.get(name))
        if op in (":-", "-"):
            return env[name] if (is_nonempty if op == ":-" else is_set) else arg
        if op in (":?", "?"):
            if not (is_nonempty if op == ":?" else is_set):
                raise MissingVariable(name)
            return env[name]
        if op in (":+", "+"):
            return arg if (is_nonempty if op == ":+" else is_set) else ""
        return env.get(name, "")

    return _VAR.sub(expand, value)


def variable_refs(value: str) -> list[tuple[str, str | None]]:
    """(name, operator) of every variable reference in value."""
    return [(m["braced"] or m["bare"], m["op"]) for m in _VAR.finditer(value) if not m["escaped"]]


def strings(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from strings(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


# --------------------------------------------------------------------------- compose helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def common_env(compose: dict[str, Any]) -> dict[str, str]:
    return env_of(compose["x-airflow-common"])


@pytest.fixture(scope="module")
def example_env() -> dict[str, str]:
    """The variables of .env.example, empty ones filled with a URL-safe dummy."""
    return {k: v or f"dummy{k.lower()}" for k, v in env_example_values().items()}


def env_example_values() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip()
    return out


def env_of(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def mounts_of(service: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of every volume entry, short or long syntax."""
    out = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            if len(parts) == 1:  # anonymous volume
                out.append(("", parts[0], False))
            else:
                mode = parts[2] if len(parts) > 2 else "rw"
                out.append((parts[0], parts[1], "ro" in mode.split(",")))
        else:
            out.append(
                (entry.get("source", ""), entry["target"], bool(entry.get("read_only", False)))
            )
    return out


def ports_of(service: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(host_ip, published, target) of every published port; host_ip '' means all interfaces."""
    out = []
    for entry in service.get("ports") or []:
        if isinstance(entry, Mapping):
            out.append(
                (
                    str(entry.get("host_ip", "")),
                    str(entry.get("published", "")),
                    str(entry["target"]),
                )
            )
            continue
        text = str(entry).split("/")[0]
        if text.startswith("["):  # [ipv6]:published:target
            ip, _, rest = text[1:].partition("]:")
            published, _, target = rest.partition(":")
            out.append((ip, published, target))
            continue
        parts = text.split(":")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            out.append(("", parts[0], parts[1]))
        else:  # container port only: published on a random host port, every interface
            out.append(("", "", parts[0]))
    return out


def command_text(service: Mapping[str, Any]) -> str:
    cmd = service.get("command") or ""
    return cmd if isinstance(cmd, str) else " ".join(str(c) for c in cmd)


def healthcheck_text(service: Mapping[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test") or ""
    return test if isinstance(test, str) else " ".join(str(t) for t in test)


def depends_on(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):  # short syntax: no condition at all
        return {name: {} for name in deps}
    return {name: (spec or {}) for name, spec in deps.items()}


def url(value: str, env: Mapping[str, str]):
    return urlsplit(interpolate(value, env))


# --------------------------------------------------------------------------- services


def test_required_services_present(services):
    missing = [s for s in REQUIRED_SERVICES if s not in services]
    assert not missing, f"services missing from docker-compose.yaml: {missing}"


def test_airflow_services_use_the_same_image_and_build(compose, services):
    common = compose["x-airflow-common"]
    assert common.get("image") and common.get("build"), "x-airflow-common needs image and build"
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        assert svc.get("image") == common["image"], name
        assert svc.get("build") == common["build"], name
    build = common["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (ROOT / context / dockerfile).resolve() == DOCKERFILE


def test_airflow_services_get_the_whole_common_environment(services, common_env):
    assert common_env, "x-airflow-common has no environment"
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        differing = {k for k, v in common_env.items() if env.get(k) != v}
        assert not differing, f"{name} lacks or overrides common variables {sorted(differing)}"


def test_executor_is_celery(common_env):
    assert common_env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert common_env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"


def test_metadata_and_results_databases_are_postgres(services, common_env, example_env):
    meta = url(common_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], example_env)
    results = url(common_env["ACCELMATRIX_RESULTS_URL"], example_env)
    assert meta.scheme == "postgresql+psycopg2", meta.scheme
    assert results.scheme.split("+")[0] == "postgresql", results.scheme
    assert meta.hostname == results.hostname == "postgres"
    meta_db, results_db = meta.path.lstrip("/"), results.path.lstrip("/")
    assert meta_db == "airflow"
    assert results_db == "accelmatrix"

    pg = services["postgres"]
    assert str(pg["image"]).startswith("postgres:16"), pg["image"]
    pg_env = env_of(pg)
    assert pg_env["POSTGRES_DB"] == meta_db
    assert pg_env["POSTGRES_USER"] == meta.username == results.username
    assert interpolate(pg_env["POSTGRES_PASSWORD"], example_env) == meta.password
    assert results.password == meta.password


def test_postgres_init_script_creates_the_results_database(services, common_env, example_env):
    results_db = url(common_env["ACCELMATRIX_RESULTS_URL"], example_env).path.lstrip("/")
    mounts = {target: source for source, target, _ in mounts_of(services["postgres"])}
    source = mounts.get("/docker-entrypoint-initdb.d")
    assert source, "postgres does not mount an init directory on /docker-entrypoint-initdb.d"
    assert (ROOT / source).resolve() == POSTGRES_INIT_DIR.resolve()
    scripts = sorted(POSTGRES_INIT_DIR.glob("*.sql")) + sorted(POSTGRES_INIT_DIR.glob("*.sh"))
    text = "\n".join(p.read_text() for p in scripts)
    assert re.search(rf"CREATE\s+DATABASE\s+\"?{results_db}\"?", text, re.I), (
        f"no init script under {POSTGRES_INIT_DIR} creates database {results_db!r}"
    )


def test_broker_is_redis_and_result_backend_postgres(services, common_env, example_env):
    broker = url(common_env["AIRFLOW__CELERY__BROKER_URL"], example_env)
    assert broker.scheme == "redis" and broker.hostname == "redis"
    assert str(services["redis"]["image"]).startswith("redis:7.2"), services["redis"]["image"]
    backend = url(common_env["AIRFLOW__CELERY__RESULT_BACKEND"], example_env)
    # psycopg2 named: SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3 (not installed).
    assert backend.scheme == "db+postgresql+psycopg2" and backend.hostname == "postgres"


def test_execution_api_url_points_at_the_apiserver(services, common_env):
    api = urlsplit(common_env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api.hostname == "airflow-apiserver" and api.hostname in services
    assert api.path == "/execution/"
    targets = {target for _, _, target in ports_of(services["airflow-apiserver"])}
    assert str(api.port) in targets, "execution API port is not the api-server's port"


def test_services_run_the_right_commands(services):
    expected = {
        "airflow-apiserver": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
        "airflow-worker": "celery worker",
    }
    for name, cmd in expected.items():
        assert command_text(services[name]).strip() == cmd, name


def test_two_celery_workers(services):
    worker = services["airflow-worker"]
    assert "celery worker" in command_text(worker)
    assert (worker.get("deploy") or {}).get("replicas") == 2
    # A fixed container_name (or a published host port) would stop the second replica.
    assert "container_name" not in worker
    assert not worker.get("ports")


def test_init_migrates_creates_pools_and_the_admin(services, common_env):
    init = services["airflow-init"]
    script = command_text(init) + " " + str(init.get("entrypoint") or "")
    assert "airflow db migrate" in script
    assert "python -m accelmatrix pools --apply" in script
    assert script.index("airflow db migrate") < script.index("accelmatrix pools")
    assert init.get("restart") in ("no", None), "a one-shot init must not restart"

    users = common_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert users.endswith(":admin") and "," not in users
    # init writes the passwords file that the api-server reads (and opens for update).
    passwords_file = common_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    passwords_dir = str(Path(passwords_file).parent)
    volumes = set()
    for name in ("airflow-init", "airflow-apiserver"):
        auth = [(s, ro) for s, t, ro in mounts_of(services[name]) if t == passwords_dir]
        assert auth and not auth[0][1], f"{name} needs {passwords_dir} mounted writable"
        volumes.add(auth[0][0])
    assert len(volumes) == 1, f"init and api-server see different auth volumes: {volumes}"
    assert "AIRFLOW_ADMIN_PASSWORD" in env_of(init)


# --------------------------------------------------------------------------- mounts


def test_sources_mounted_into_every_airflow_service(services):
    for name in AIRFLOW_SERVICES:
        mounts = {(source, target) for source, target, _ in mounts_of(services[name])}
        missing = [f"{s}:{t}" for s, t in SOURCE_MOUNTS.items() if (s, t) not in mounts]
        assert not missing, f"{name} does not mount {missing}"


def test_include_dir_setting_matches_the_mount(common_env):
    assert common_env["ACCELMATRIX_INCLUDE_DIR"] == SOURCE_MOUNTS["./include"]


def test_artifacts_volume_shared_by_worker_triggerer_and_apiserver(compose, services, common_env):
    target = common_env["ACCELMATRIX_ARTIFACTS_DIR"]
    assert target.startswith("/")
    sources = set()
    for name in AIRFLOW_SERVICES:
        found = [(s, ro) for s, t, ro in mounts_of(services[name]) if t == target]
        if name in ("airflow-worker", "airflow-triggerer", "airflow-apiserver"):
            assert found, f"{name} does not mount the artifacts volume on {target}"
        if found:
            source, read_only = found[0]
            assert not read_only or name == "airflow-apiserver", f"{name}: artifacts read-only"
            sources.add(source)
    assert len(sources) == 1, f"services mount different artifacts volumes: {sources}"
    (source,) = sources
    assert not source.startswith((".", "/", "~")), "artifacts must be a named volume"
    assert source in (compose.get("volumes") or {}), f"volume {source} not declared"


# --------------------------------------------------------------------------- ports


def test_only_loopback_ports_are_published(services):
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", f"{name} uses the host network"
        for host_ip, published, target in ports_of(svc):
            assert host_ip in ("127.0.0.1", "::1"), (
                f"{name} publishes {published or '?'}->{target} on all interfaces"
            )


def test_apiserver_published_on_localhost_8080(services):
    assert ("127.0.0.1", "8080", "8080") in ports_of(services["airflow-apiserver"])
    published = {n for n, s in services.items() if s.get("ports")}
    assert published == {"airflow-apiserver"}, f"unexpected published ports: {published}"


def test_port_parser_sees_all_interface_bindings():
    svc = {"ports": ["8080:8080", "5555", {"target": 80, "published": 8000}, "0.0.0.0:1:1"]}
    assert [ip for ip, _, _ in ports_of(svc)] == ["", "", "", "0.0.0.0"]


# --------------------------------------------------------------------------- secrets


def literal_secret_findings(data: Any) -> list[str]:
    """Places where a secret is written into the compose data instead of referenced."""
    findings = []
    for path, value in strings(data):
        key = path[-1] if path else ""
        for name, op in variable_refs(value):
            if name in SECRET_VARIABLES and op not in (":?", "?"):
                findings.append(f"{'.'.join(path)}: ${name} must be required, not {op!r}")
        if key != "test" and SECRET_NAME.search(key) and not key.endswith(("_FILE", "_CMD")):
            refs = variable_refs(value)
            whole_ref = len(refs) == 1 and re.fullmatch(r"\$\{[^}]*\}", value.strip())
            if not whole_ref and DOCUMENTED_DEV_DEFAULTS.get(key) != value:
                findings.append(f"{'.'.join(path)}: literal value for a secret")
        for part in re.findall(r"://[^/\s@]*@", value):  # user:password@ in a URL
            userinfo = part[3:-1]
            if ":" in userinfo:
                password = userinfo.split(":", 1)[1]
                if not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:\?[^}]*\}", password):
                    findings.append(f"{'.'.join(path)}: literal password in a URL")
        if re.search(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}=", value):
            findings.append(f"{'.'.join(path)}: looks like a Fernet key")
    return findings


def test_no_literal_secrets_in_compose(compose):
    assert literal_secret_findings(compose) == []


def test_secret_scanner_flags_literals():
    planted = {
        "services": {
            "a": {"environment": {"AIRFLOW__CORE__FERNET_KEY": "x" * 43 + "="}},
            "b": {"environment": {"AIRFLOW__API_AUTH__JWT_SECRET": "hunter2"}},
            "c": {"environment": {"POSTGRES_PASSWORD": "${POSTGRES_PASSWORD:-airflow}"}},
            "d": {"environment": {"X_URL": "postgresql://airflow:airflow@postgres/airflow"}},
            "e": {"environment": {"ok": "postgresql://airflow:${POSTGRES_PASSWORD:?}@pg/x"}},
        }
    }
    findings = literal_secret_findings(planted)
    for svc in "abcd":
        assert any(f.startswith(f"services.{svc}.") for f in findings), (svc, findings)
    assert not any(f.startswith("services.e.") for f in findings), findings


def test_compose_refuses_to_start_without_the_secrets(compose, example_env):
    text = COMPOSE_FILE.read_text()
    # Every secret is referenced and required: expanding with it unset fails.
    for name in SECRET_VARIABLES:
        assert f"${{{name}:?" in text, f"{name} is not used as a required variable"
        env = {k: v for k, v in example_env.items() if k != name}
        with pytest.raises(MissingVariable):
            for _, value in strings(compose):
                interpolate(value, env)
    # With .env.example filled in, everything expands.
    for _, value in strings(compose):
        interpolate(value, example_env)


def test_every_compose_variable_is_documented_in_env_example(compose, example_env):
    used = {name for _, value in strings(compose) for name, _ in variable_refs(value)}
    undocumented = used - set(example_env)
    assert not undocumented, f"add to .env.example: {sorted(undocumented)}"
    assert not {k for k, v in env_example_values().items() if k in SECRET_VARIABLES and v}, (
        ".env.example must not carry secret values"
    )


def test_workloads_never_see_secrets(services, example_env, monkeypatch):
    """Secrets reach long-running services only under names LocalBackend hides from workloads."""
    secret_values = {example_env[name] for name in SECRET_VARIABLES}
    for name in LONG_RUNNING_AIRFLOW_SERVICES:
        env = {k: interpolate(v, example_env) for k, v in env_of(services[name]).items()}
        exposed = {
            k
            for k, v in env.items()
            if any(s in v for s in secret_values)
            and not k.startswith(WORKLOAD_HIDDEN_PREFIXES)
            and k not in WORKLOAD_HIDDEN_NAMES
        }
        assert not exposed, f"{name}: workloads would inherit secrets via {sorted(exposed)}"
        assert "AIRFLOW_ADMIN_PASSWORD" not in env, f"{name} must not get the admin password"

    # And the real filter agrees (the worker is where LocalBackend runs).
    from accelmatrix.backends.local import backend as local

    env_fn = getattr(getattr(local, "LocalBackend", None), "_env", None)
    # A renamed filter must not switch this check off: it fails until it is pointed anew.
    assert env_fn is not None, "LocalBackend._env is gone: point this check at its filter"
    worker_env = {
        k: interpolate(v, example_env) for k, v in env_of(services["airflow-worker"]).items()
    }
    monkeypatch.setattr(os, "environ", worker_env)
    from accelmatrix.contracts.machine_records import LocalResource

    child = env_fn(None, LocalResource(name="/tmp/w", work_dir="/tmp/w"), {})
    leaked = {k for k, v in child.items() if any(s in v for s in secret_values)}
    assert not leaked, f"LocalBackend passes secrets to workloads via {sorted(leaked)}"


def test_accelmatrix_variables_are_ones_the_package_reads(common_env):
    source = "\n".join(
        p.read_text() for p in (ROOT / "plugins" / "accelmatrix").rglob("*.py") if p.is_file()
    )
    unknown = [k for k in common_env if k.startswith("ACCELMATRIX_") and k not in source]
    assert not unknown, f"accelmatrix never reads {unknown}"


def test_airflow_options_exist_in_airflow_3_3(common_env):
    spec = importlib.util.find_spec("airflow")
    assert spec is not None and spec.submodule_search_locations, "apache-airflow is not installed"
    pkg = Path(next(iter(spec.submodule_search_locations)))
    config = yaml.safe_load((pkg / "config_templates" / "config.yml").read_text())
    checked = 0
    for key in common_env:
        if not key.startswith("AIRFLOW__"):
            continue
        section, _, option = key[len("AIRFLOW__") :].lower().partition("__")
        if section not in config:  # e.g. [celery], defined by the provider in the image
            continue
        assert option in config[section]["options"], f"{key}: no [{section}] {option} in Airflow"
        checked += 1
    assert checked >= 5
    auth_manager = common_env["AIRFLOW__CORE__AUTH_MANAGER"]
    module = auth_manager.rsplit(".", 1)[0]
    assert (pkg.parent / (module.replace(".", "/") + ".py")).is_file(), auth_manager


# --------------------------------------------------------------------------- health


def test_healthchecks(services, common_env):
    for name in (
        "postgres",
        "redis",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-worker",
    ):
        hc = services[name].get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{name} has no healthcheck"
        assert healthcheck_text(services[name]) not in ("NONE",), name
    assert "pg_isready" in healthcheck_text(services["postgres"])
    assert "redis-cli ping" in healthcheck_text(services["redis"])
    assert "localhost:8080/api/v2/monitor/health" in healthcheck_text(services["airflow-apiserver"])
    # The scheduler's /health server only runs when enabled.
    assert common_env["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"].lower() == "true"
    assert ":8974/health" in healthcheck_text(services["airflow-scheduler"])
    assert "inspect ping" in healthcheck_text(services["airflow-worker"])


def test_depends_on_waits_for_healthy_services(services):
    for name, svc in services.items():
        for dep, spec in depends_on(svc).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = spec.get("condition")
            assert condition in ("service_healthy", "service_completed_successfully"), (
                f"{name} -> {dep}: condition {condition!r}"
            )
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), f"{dep} has no healthcheck"
            else:
                assert dep == "airflow-init", f"{name} waits for {dep} to exit"

    for name in AIRFLOW_SERVICES:
        deps = depends_on(services[name])
        for backing in ("postgres", "redis"):
            assert deps.get(backing, {}).get("condition") == "service_healthy", (name, backing)
    for name in LONG_RUNNING_AIRFLOW_SERVICES:
        init = depends_on(services[name]).get("airflow-init", {})
        assert init.get("condition") == "service_completed_successfully", name
    for name in ("airflow-worker", "airflow-triggerer"):  # they call the execution API
        api = depends_on(services[name]).get("airflow-apiserver", {})
        assert api.get("condition") == "service_healthy", name


# --------------------------------------------------------------------------- image


def dockerfile_instructions() -> list[tuple[str, str]]:
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    out = []
    for line in lines:
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def requirement_pins() -> dict[str, str]:
    pins = {}
    for raw in REQUIREMENTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([A-Za-z0-9.+!_-]+)", line)
        assert m, f"requirements.txt: {line!r} is not an exact `name==version` pin"
        name = re.sub(r"[-_.]+", "-", m[1]).lower()
        assert name not in pins, f"requirements.txt pins {name} twice"
        pins[name] = m[3]
    return pins


def test_requirements_are_exact_pins():
    pins = requirement_pins()
    for name in ("apache-airflow", "torch", "pandas", "great-expectations"):
        assert name in pins, f"{name} not pinned in requirements.txt"


def test_requirement_pins_match_the_dev_venv():
    """The image installs the same versions the tests run against."""
    drift = {}
    for name, version in requirement_pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drift[name] = (version, None)
            continue
        if installed.split("+")[0] != version.split("+")[0]:  # torch 2.13.0+cpu == 2.13.0
            drift[name] = (version, installed)
    assert not drift, f"pinned vs installed: {drift}"


def test_dockerfile_base_image_matches_the_airflow_pin():
    instructions = dockerfile_instructions()
    froms = [rest for op, rest in instructions if op == "FROM"]
    assert froms and froms[0].split()[0] == BASE_IMAGE, froms
    assert len(froms) == 1, "single-stage build expected"
    tag_version = BASE_IMAGE.split(":")[1].split("-")[0]
    assert requirement_pins()["apache-airflow"] == tag_version


def _dockerfile_args(instructions) -> dict[str, str]:
    args = {}
    for op, rest in instructions:
        if op == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value.strip("\"'")
    return args


def _copies(instructions) -> dict[str, str]:
    """Source -> destination of every COPY from the build context."""
    out = {}
    for op, rest in instructions:
        if op == "COPY":
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            for src in words[:-1]:
                out[src.rstrip("/")] = words[-1]
    return out


def test_dockerfile_installs_requirements_with_the_cpu_torch_index():
    instructions = dockerfile_instructions()
    args = _dockerfile_args(instructions)
    copies = _copies(instructions)
    assert "requirements.txt" in copies, "requirements.txt is never copied into the image"
    req_dest = copies["requirements.txt"]
    pip_runs = [
        interpolate(rest, args)
        for op, rest in instructions
        if op == "RUN" and "pip install" in rest
    ]
    req_runs = [r for r in pip_runs if re.search(rf"-r\s+{re.escape(req_dest)}(\s|$)", r)]
    assert req_runs, f"no RUN pip install -r {req_dest}"
    run = req_runs[0]
    assert f"--extra-index-url {TORCH_CPU_INDEX}" in run.replace('"', ""), run
    assert not re.search(r"--index-url\s", run), "--index-url would drop PyPI"


def test_dockerfile_installs_the_accelmatrix_package():
    instructions = dockerfile_instructions()
    copies = _copies(instructions)
    assert "pyproject.toml" in copies and "plugins/accelmatrix" in copies
    src_dir = str(Path(copies["pyproject.toml"]).parent)
    assert copies["plugins/accelmatrix"].rstrip("/") == f"{src_dir}/plugins/accelmatrix"
    pip_runs = [rest for op, rest in instructions if op == "RUN" and "pip install" in rest]
    assert any(re.search(rf"pip install [^&;]*{re.escape(src_dir)}(\s|$)", r) for r in pip_runs), (
        f"no pip install of {src_dir}"
    )


# What only tests may run: the API emulators, their controllers, the Airflow stack launcher.
TEST_KIT = ROOT / "tests" / "accelmatrix_testkit"
TEST_KIT_MODULES = {p.stem for p in TEST_KIT.glob("*.py") if p.stem != "__init__"}


def _is_test_kit(name: str) -> bool:
    """A path (in the repository or in a wheel) that belongs to the test kit."""
    parts = Path(name).parts
    return (
        "accelmatrix_testkit" in parts
        or "testing" in parts
        or "emulator" in name
        or (len(parts) > 1 and parts[-2] == "accelmatrix" and Path(name).stem in TEST_KIT_MODULES)
    )


def test_the_image_copies_no_emulator():
    """Every file the Dockerfile copies into the image, walked on disk: none is the test kit,
    and no Python file among them imports it."""
    assert {"k8s_emulator", "tpu_emulator", "airflow_stack"} <= TEST_KIT_MODULES
    shipped = []
    for src in _copies(dockerfile_instructions()):
        path = ROOT / src
        shipped += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    assert any(p.as_posix().endswith("backends/kubernetes/job.py") for p in shipped), (
        "the walk missed the backends"
    )
    kit = [str(p.relative_to(ROOT)) for p in shipped if _is_test_kit(str(p.relative_to(ROOT)))]
    assert not kit, f"the image would contain the test kit: {kit}"
    importers = [
        str(p.relative_to(ROOT))
        for p in shipped
        if p.suffix == ".py" and "accelmatrix_testkit" in p.read_text(errors="replace")
    ]
    assert not importers, f"shipped code refers to the test kit: {importers}"


def test_the_installed_package_has_no_emulator(tmp_path):
    """Build the wheel from what the Dockerfile copies to install (pyproject.toml and
    plugins/accelmatrix, the same layout), as its `pip install` does: no test-kit module in it."""
    src = tmp_path / "src"
    copies = _copies(dockerfile_instructions())
    dest_root = Path(copies["pyproject.toml"]).parent
    for from_, to in copies.items():
        if not to.startswith(str(dest_root) + "/") or from_ in ("requirements.txt",):
            continue
        target = src / Path(to).relative_to(dest_root)
        if (ROOT / from_).is_dir():
            shutil.copytree(
                ROOT / from_, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / from_, target)
    out = tmp_path / "wheel"
    subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("accelmatrix-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert (
        "accelmatrix/backends/kubernetes/job.py" in names
        and "accelmatrix/ui/static" in " ".join(names)
    )
    kit = [n for n in names if _is_test_kit(n)]
    assert not kit, f"the accelmatrix wheel contains the test kit: {kit}"


def test_build_context_has_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for must_ignore in (".venv", ".git", ".env"):
        assert must_ignore in patterns, f".dockerignore must exclude {must_ignore}"
    for src in _copies(dockerfile_instructions()):
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        top = src.split("/")[0]
        assert top not in patterns and src not in patterns, f".dockerignore excludes {src}"


def test_deploy_doc_names_every_service_and_variable(services, common_env):
    doc = DEPLOY_DOC.read_text()
    for name in services:
        assert f"`{name}`" in doc, f"docs/deploy.md does not describe {name}"
    for var in [*env_example_values(), *(k for k in common_env if k.startswith("ACCELMATRIX_"))]:
        assert var in doc, f"docs/deploy.md does not mention {var}"
