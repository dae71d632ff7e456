"""The warehouse export without a warehouse: settings refused with the setting named, the
documented schema (docs/results-schema.md) against the row records the tables are made
from, the rows a run gives, the replacing transaction, and the store's retention.
The export against a real BigQuery emulator: tests/test_warehouse_emulator.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore
from accelmatrix.warehouse.config import ConfigError, Retention, WarehouseConfig, export_enabled
from accelmatrix.warehouse.export import ExportBatch, Warehouse, collect, finished_runs_since
from accelmatrix.warehouse.retention import prune_store
from accelmatrix.warehouse.rows import TABLES, CellRow, bigquery_fields, staging_fields
from accelmatrix.warehouse.views import view_statements
from accelmatrix_testkit.warehouse_runs import expected_rows, fill_run

ROOT = Path(__file__).resolve().parents[1]
DAY = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path) -> ResultsStore:
    return ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ACCELMATRIX_WAREHOUSE_DATASET": "p.bad-name"}, "ACCELMATRIX_WAREHOUSE_DATASET"),
        ({"ACCELMATRIX_WAREHOUSE_DATASET": "d", "ACCELMATRIX_WAREHOUSE_DEADLINE_S": "0"},
         "ACCELMATRIX_WAREHOUSE_DEADLINE_S"),
        ({"ACCELMATRIX_WAREHOUSE_DATASET": "d", "ACCELMATRIX_WAREHOUSE_ENDPOINT": "127.0.0.1:9"},
         "ACCELMATRIX_WAREHOUSE_ENDPOINT"),
        ({"ACCELMATRIX_WAREHOUSE_DATASET": "d", "ACCELMATRIX_RETENTION": "nightly=3"},
         "default, pull_request, followup"),
        ({"ACCELMATRIX_WAREHOUSE_DATASET": "d", "ACCELMATRIX_RETENTION": "default=0"},
         "whole number >= 1"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_the_setting_named(env, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        WarehouseConfig.from_env(env)


def test_settings():
    assert WarehouseConfig.from_env({}) is None and not export_enabled({})
    env = {
        "ACCELMATRIX_WAREHOUSE_DATASET": "team-proj.accel_results",
        "ACCELMATRIX_RETENTION": "default=365,pull_request=42",
    }
    cfg = WarehouseConfig.from_env(env)
    assert export_enabled(env)
    assert (cfg.project, cfg.dataset, cfg.conn_id) == (
        "team-proj", "accel_results", "google_cloud_default",
    )  # fmt: skip
    r = cfg.retention
    assert (r.for_kind("pull_request"), r.for_kind("followup"), r.longest) == (42, 365, 365)
    # Unset: nothing expires; only pull requests named: the rest is kept for good.
    assert Retention.parse("").longest is None
    assert Retention.parse("pull_request=42").for_kind("default") is None


def _documented_tables() -> dict[str, list[tuple[str, str, str]]]:
    """The BigQuery tables section of docs/results-schema.md: (column, type, mode) rows."""
    text = (ROOT / "docs" / "results-schema.md").read_text()
    section = text.split("## BigQuery tables", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[tuple[str, str, str]]] = {}
    for block in section.split("\n### ")[1:]:
        name = block.split("`")[1]
        rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (\w+) \|", block, flags=re.M)
        tables[name] = rows
    return tables


def test_docs_describe_every_table_and_column_as_created():
    documented = _documented_tables()
    assert set(documented) == {t.name for t in TABLES}
    for spec in TABLES:
        made = [(n, kind, mode) for n, kind, mode, _ in bigquery_fields(spec.row)]
        assert documented[spec.name] == made, spec.name


def test_rows_of_a_run(store):
    fill_run(store, "suite_a", "r1", cells=10, logical_date=DAY, failed=frozenset({2, 7}))
    batch = collect(store, [("suite_a", "r1"), ("suite_a", "r1")])  # a key twice: once
    assert {k: len(v) for k, v in batch.rows.items() if k in expected_rows(10)} == expected_rows(10)
    run = batch.rows["runs"][0]
    assert (run.cells_total, run.cells_passed, run.cells_failed, run.state) == (10, 8, 2, "failed")
    assert {c.run_date for c in batch.rows["cells"]} == {DAY.date()}
    assert sorted(c.cell_index for c in batch.rows["cells"] if not c.passed) == [2, 7]
    with pytest.raises(LookupError, match="no run 'nope' of 'suite_a'"):
        collect(store, [("suite_a", "nope")])


def test_backfill_selects_decided_runs_since_a_day(store):
    for i in range(4):
        fill_run(store, "suite_a", f"n{i}", cells=1, logical_date=DAY + timedelta(days=i))
    store.upsert_run("suite_a", "running", logical_date=DAY + timedelta(days=3), state="running")
    got = finished_runs_since(store, (DAY + timedelta(days=2)).date())
    assert got == [("suite_a", "n2"), ("suite_a", "n3")]


def test_the_transaction_replaces_what_it_loads():
    wh = Warehouse(WarehouseConfig(dataset="d", project="p"), client=_NoClient())
    batch = ExportBatch(runs=[("s", "it's"), ("s", "r2")], suites=["s"], rows={})
    sql = wh._replace_script(batch, "p.d._stage_x", {"cells"})
    lines = sql.splitlines()
    assert lines[0] == "BEGIN TRANSACTION;" and lines[-1] == "COMMIT TRANSACTION;"
    assert sum(line.startswith("DELETE FROM") for line in lines) == len(TABLES)
    # Only what was staged is inserted; a quote in a run id stays inside its literal.
    assert [x for x in lines if x.startswith("INSERT")] == [
        "INSERT INTO `p.d.cells` ("
        + ", ".join(n for n, *_ in bigquery_fields(CellRow))
        + ") SELECT "
        + ", ".join(n for n, *_ in bigquery_fields(CellRow))
        + " FROM `p.d._stage_x` WHERE _table = 'cells';"
    ]
    assert "STRUCT<suite STRING, run_id STRING>('s', 'it\\'s')" in sql


class _NoClient:
    project = "p"


def test_one_staging_table_holds_every_tables_rows():
    cols = {n: kind for n, kind, _m, _t in staging_fields()}
    for spec in TABLES:
        for n, kind, _m, _t in bigquery_fields(spec.row):
            assert cols[n] == kind
    line = msgspec.json.encode(CellRow(
        suite="s", run_id="r", run_date=DAY.date(), run_kind="default", cell_id="c",
        state="passed", passed=True,
    ))  # fmt: skip
    assert msgspec.json.decode(line)["_table"] == "cells"


def test_view_file_names_the_dataset_everywhere():
    stmts = view_statements("p.d")
    assert [s.split("`")[1] for s in stmts] == ["p.d.cell_nights", "p.d.cell_night_metrics"]
    assert all("{dataset}" not in s and "--" not in s for s in stmts)


def test_store_retention_by_kind(store, monkeypatch):
    now = DAY + timedelta(days=400)
    fill_run(store, "s", "old", cells=2, logical_date=now - timedelta(days=366))
    fill_run(store, "s", "kept", cells=2, logical_date=now - timedelta(days=300))
    fill_run(store, "s", "pr_old", cells=2, logical_date=now - timedelta(days=43))
    fill_run(store, "s", "pr_new", cells=2, logical_date=now - timedelta(days=41))
    for rid in ("pr_old", "pr_new"):
        store.add_pull_request_run(_pr_run(PullRequestRun, rid))
    assert prune_store(store, Retention(days={}), now) == {}
    deleted = prune_store(store, Retention.parse("default=365,pull_request=42"), now)
    assert deleted == {"default": 1, "pull_request": 1}
    left = {r.run_id for r in store.get_runs("s")}
    assert left == {"kept", "pr_new"}
    assert store.get_cells("s", "old") == [] and store.get_metrics("s", "old") == []
    assert store.get_checks("s", "pr_old") == [] and len(store.get_checks("s", "kept")) == 4


def _pr_run(cls, run_id):
    return cls(
        dag_id="s", run_id=run_id, kind="verdict", repo="o/r", number=1, head_sha="a" * 40,
        base_ref="main", base_sha="b" * 40, sender="u", fork=False,
    )  # fmt: skip


def test_which_errors_are_tried_again():
    import requests
    from google.api_core import exceptions as api

    from accelmatrix.warehouse.export import _transient

    assert _transient(requests.exceptions.ConnectionError("refused"))
    assert _transient(api.ServiceUnavailable("503"))
    assert _transient(
        api.BadRequest("Could not serialize access to table t due to concurrent update")
    )
    assert not _transient(api.BadRequest("No such field: foo"))
    assert not _transient(api.Forbidden("no bigquery.jobs.create"))
    assert not _transient(ValueError("ours"))


def test_the_client_comes_from_the_airflow_connection(monkeypatch):
    """No endpoint: the Google provider's BigQueryHook builds the client from the
    connection (its service account key and project); nothing is sent until it is used."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    account = {
        "type": "service_account",
        "project_id": "team-proj",
        "private_key_id": "1",
        "private_key": pem,
        "client_email": "accelmatrix-export@team-proj.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": {"keyfile_dict": json.dumps(account), "project": "team-proj"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_ACCEL_BQ", json.dumps(conn))
    cfg = WarehouseConfig.from_env(
        {
            "ACCELMATRIX_WAREHOUSE_DATASET": "accel_results",
            "ACCELMATRIX_WAREHOUSE_CONN_ID": "accel_bq",
        }
    )
    wh = Warehouse(cfg)
    assert wh.client.project == "team-proj"
    assert wh.client._credentials.service_account_email == account["client_email"]
    assert wh.dataset_id == "team-proj.accel_results"


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--since", "2026-11-01", "--run-id", "r"], {}, "not both"),
        (["--run-id", "r"], {}, "--run-id needs --dag-id"),
        (["--since", "2026-11-01"], {}, "ACCELMATRIX_WAREHOUSE_DATASET is not set"),
        (["--since", "2026-11-01"], {"ACCELMATRIX_WAREHOUSE_DATASET": "a b"},
         "ACCELMATRIX_WAREHOUSE_DATASET='a b'"),
    ],
)  # fmt: skip
def test_export_command_usage_errors(argv, env, said, monkeypatch, capsys):
    from accelmatrix import cli

    monkeypatch.delenv("ACCELMATRIX_WAREHOUSE_DATASET", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and "Traceback" not in err
