"""Secrets stay in Airflow connections; hostile values never reach a shell.

One `dag.test()` run of a suite with a local cell and an SSH cell (the loopback sshd) whose
workload and setup echo their whole environment and argv. Before the run, secrets are placed
where an operator would put them: Airflow connections (the SSH connection's private key, a
database password, an HTTP token), an Airflow variable, and Airflow's own configuration
(fernet key, JWT secret). Afterwards every file under the artifacts dir and the Airflow logs
dir, everything the tasks printed, and every row of every results-store table is searched for
those values.

The same run carries hostile strings (`$(touch ...)`, backticks, `;`, newlines, quotes,
`${python}`) in YAML axis values, YAML param defaults and a UI param (run conf), used in
the setup and run argv and in env values, on both backends: no PWNED file may appear and
each string must arrive as exactly one argv element.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest
import yaml

from accelmatrix import settings

pytest_plugins = ["sshd"]

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "hostile_echo"
SSH_CONN = "accelmatrix_test_ssh"

# Prints its argv and whole environment as JSON and writes them as an artifact.
ECHO = (
    "import json, os, sys\n"
    "os.makedirs('out', exist_ok=True)\n"
    "doc = {'argv': sys.argv[1:], 'env': dict(os.environ)}\n"
    "open('out/echo.json', 'w').write(json.dumps(doc))\n"
    "print('ECHO ' + json.dumps(doc), flush=True)\n"
    "print('\\n'.join(f'{k}={v}' for k, v in os.environ.items()), flush=True)\n"
)


def hostile(pwned: Path) -> dict[str, str]:
    return {
        "subst": f"$(touch {pwned}/subst)",
        "semi": f"x; touch {pwned}/semi",
        "tick": f"`touch {pwned}/tick`",
        "newline": f"line1\ntouch {pwned}/newline\nline3",
        "quotes": f"it's \"q\" ' ; touch {pwned}/quotes #",
        "template": "${python} ${work_dir} $${params.x} ${HOME}",
    }


def _suite(pwned: Path, remote_root: Path) -> dict:
    h = hostile(pwned)
    return {
        "description": "echo env and argv; hostile values everywhere",
        "axes": {
            "machine": ["cpu", "remote"],
            "payload": {"p": {"text": h["subst"], "other": h["newline"]}},
        },
        "machines": {
            "cpu": {"backend": "local"},
            "remote": {
                "backend": "ssh",
                "ssh_conn_id": SSH_CONN,
                "python": sys.executable,
                "work_root": str(remote_root),
            },
        },
        "params": {
            "semi": {"type": "string", "default": h["semi"]},
            "tick": {"type": "string", "default": h["tick"]},
            "quotes": {"type": "string", "default": "harmless"},  # set through run conf
        },
        "workload": {
            "setup": [
                [
                    "${python}",
                    "-c",
                    "import sys, os; print('SETUP', sys.argv[1:]); print(dict(os.environ))",
                    "${axis.payload.text}",
                    "${params.tick}",
                ]
            ],
            "run": [
                "${python}",
                "-c",
                ECHO,
                "${axis.payload.text}",
                "${axis.payload.other}",
                "${params.semi}",
                "${params.tick}",
                "${params.quotes}",
                "pre ${params.quotes} post",
            ],
            "env": {"HOSTILE_ENV": "${params.semi}", "HOSTILE_TPL": "${params.quotes}"},
            "artifacts": ["out/**"],
            "timeout": 60,
        },
        "checks": [{"type": "log_contains", "pattern": "ECHO"}],
    }


@pytest.fixture(scope="module")
def echo_run(airflow_db, sshd_server, tmp_path_factory):
    """Run the suite once; return what the tests search."""
    from cryptography.fernet import Fernet

    tmp = tmp_path_factory.mktemp("security")
    pwned = tmp / "pwned"
    pwned.mkdir()
    suites = tmp / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(yaml.safe_dump(_suite(pwned, tmp / "remote")))
    ssh_conn = sshd_server.connection()
    found = {
        "ssh private key": ssh_conn["extra"]["private_key"],
        "db password": "pw-" + secrets.token_hex(12),
        "http token": "tok-" + secrets.token_hex(12),
        "variable": "var-" + secrets.token_hex(12),
        "fernet key": Fernet.generate_key().decode(),
        "jwt secret": "jwt-" + secrets.token_hex(16),
    }
    env = {
        "ACCELMATRIX_SUITES_DIR": str(suites),
        "ACCELMATRIX_HOME": str(tmp / "accelmatrix"),
        f"AIRFLOW_CONN_{SSH_CONN.upper()}": json.dumps(ssh_conn),
        "AIRFLOW_CONN_ACCELMATRIX_SECRET_DB": json.dumps(
            {"conn_type": "postgres", "host": "db", "login": "u", "password": found["db password"]}
        ),
        "AIRFLOW_CONN_ACCELMATRIX_SECRET_HTTP": json.dumps(
            {"conn_type": "http", "host": "hooks", "extra": {"token": found["http token"]}}
        ),
        "AIRFLOW_VAR_ACCELMATRIX_API_TOKEN": found["variable"],
        "AIRFLOW__CORE__FERNET_KEY": found["fernet key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": found["jwt secret"],
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        from test_dag_local import run_dag

        state, run_id, tis = run_dag(DAG_ID, {"quotes": hostile(pwned)["quotes"]})
        from accelmatrix.results import schema
        from accelmatrix.results.store import ResultsStore

        store = ResultsStore.from_settings()
        with store._reading() as conn:
            rows = [
                f"{t.name}: {dict(r._mapping)}"
                for t in schema.metadata.sorted_tables
                for r in conn.execute(t.select()).all()
            ]
        artifacts = settings.artifacts_dir() / DAG_ID
        echoes = {
            cell: json.loads(
                (
                    artifacts / settings.safe_name(run_id) / cell / "files" / "out" / "echo.json"
                ).read_text()
            )
            for cell in ("machine=cpu,payload=p", "machine=remote,payload=p")
        }
        yield {
            "state": state,
            "tis": tis,
            "secrets": found,
            "rows": rows,
            "artifacts": artifacts,
            "pwned": pwned,
            "echoes": echoes,
            "hostile": hostile(pwned),
        }


def _needles(value: str) -> list[str]:
    """The secret and, for a PEM key, each of its body lines (a log may split it)."""
    out = [value]
    out += [ln.strip() for ln in value.splitlines() if len(ln.strip()) >= 16 and "-----" not in ln]
    return out


@pytest.mark.integration
@pytest.mark.slow(90)
def test_no_secret_in_logs_artifacts_or_results(echo_run, capfd):
    assert echo_run["state"] == "success", echo_run["tis"]
    printed = capfd.readouterr()
    haystacks: dict[str, str] = {"task output (stdout/stderr)": printed.out + printed.err}
    logs_dir = Path(settings.airflow_home()) / "logs"
    files = [p for p in echo_run["artifacts"].rglob("*") if p.is_file()]
    files += [p for p in logs_dir.rglob("*") if p.is_file()]
    assert any(p.name == "echo.json" for p in files)
    for p in files:
        haystacks[str(p)] = p.read_text(errors="replace")
    haystacks["results store"] = "\n".join(echo_run["rows"])
    # The workload really echoed its environment: the check would be empty otherwise.
    assert "HOSTILE_ENV=" in haystacks["task output (stdout/stderr)"] or any(
        "HOSTILE_ENV=" in h for h in haystacks.values()
    )
    leaks = [
        f"{what} in {where}"
        for what, value in echo_run["secrets"].items()
        for needle in _needles(value)
        for where, text in haystacks.items()
        if needle in text
    ]
    assert leaks == []
    for cell, doc in echo_run["echoes"].items():
        # AIRFLOW_CTX_* (dag id, run id, try number) is the task context, not a secret.
        leaked_names = sorted(
            k for k in doc["env"] if k.startswith("AIRFLOW") and not k.startswith("AIRFLOW_CTX_")
        )
        assert leaked_names == [], (cell, leaked_names)
        assert "ACCELMATRIX_RESULTS_URL" not in doc["env"]


@pytest.mark.integration
def test_hostile_values_arrive_verbatim_as_one_argv_element(echo_run):
    assert echo_run["state"] == "success", echo_run["tis"]
    h = echo_run["hostile"]
    assert sorted(p.name for p in echo_run["pwned"].iterdir()) == []
    for cell, doc in echo_run["echoes"].items():
        assert doc["argv"] == [
            h["subst"],
            h["newline"],
            h["semi"],
            h["tick"],
            h["quotes"],
            f"pre {h['quotes']} post",
        ], cell
        assert doc["env"]["HOSTILE_ENV"] == h["semi"]
        assert doc["env"]["HOSTILE_TPL"] == h["quotes"]


def test_a_param_holding_placeholders_is_not_expanded():
    """`${python}` inside a UI param reaches the workload as written (no second expansion)."""
    from accelmatrix.spec.plan import expand
    from accelmatrix.spec.suite import Suite

    suite = Suite.model_validate(
        {
            "axes": {"a": [1]},
            "machines": {"cpu": {"backend": "local"}},
            "params": {"x": {"type": "string", "default": ""}},
            "workload": {"run": ["${python}", "${params.x}"], "env": {"E": "${params.x}"}},
        }
    )
    (cell,) = expand(suite, "d", params={"x": "${python} $${work_dir} ${nope"}).cells
    from accelmatrix.spec.templating import render_tree

    final = render_tree(cell.workload.run, {"python": "PY", "work_dir": "W"})
    assert final == ["PY", "${python} $${work_dir} ${nope"]
    assert render_tree(cell.workload.env, {"python": "PY"}) == {
        "E": "${python} $${work_dir} ${nope"
    }


MACHINES = {
    "local": ({"backend": "local"}, ["password", "token", "private_key", "key_file"], "unknown"),
    "ssh": (
        {"backend": "ssh", "ssh_conn_id": "c"},
        ["host", "port", "user", "login", "password", "key_file", "private_key", "passphrase"],
        "ssh_conn_id",
    ),
    "tpu-vm": (
        {
            "backend": "tpu-vm",
            "zone": "us-central2-b",
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
        },
        ["key_path", "keyfile_dict", "credentials", "access_token", "ssh_key_file", "password"],
        "gcp_conn_id",
    ),
    "k8s-job": (
        {"backend": "k8s-job", "image": "python:3.11-slim"},
        ["host", "token", "bearer_token", "password", "kube_config", "client_key"],
        "kubernetes_conn_id",
    ),
    "k8s-jobset": (
        {"backend": "k8s-jobset", "image": "python:3.11-slim"},
        ["host", "token", "kube_config", "client_key"],
        "kubernetes_conn_id",
    ),
    "gke-tpu": (
        {
            "backend": "gke-tpu",
            "image": "python:3.11-slim",
            "accelerator_type": "v6e-8",
            "topology": "2x4",
        },
        ["token", "kube_config"],
        "kubernetes_conn_id",
    ),
}


@pytest.mark.parametrize(
    ("backend", "key"), [(b, k) for b, (_, keys, _) in MACHINES.items() for k in keys]
)
def test_no_backend_takes_credentials_from_suite_yaml(tmp_path, backend, key):
    """Every machine model refuses credential keys, naming the file, field and the way out."""
    from accelmatrix.spec.loader import SuiteError, load_suite

    spec, _, where = MACHINES[backend]
    suite = {
        "axes": {"a": [1]},
        "machines": {"gpu": {**spec, key: "s3cr3t-value"}},
        "workload": {"run": ["python", "-c", "pass"]},
    }
    path = tmp_path / "creds.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    text = str(err.value)
    assert text.startswith(f"{path}: invalid suite") and "machines.gpu" in text
    assert key in text and where in text, text
    assert "s3cr3t-value" not in text  # the error does not echo the secret either
