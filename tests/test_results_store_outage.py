"""The results store on PostgreSQL rides out a short outage of its server.

A step that writes while PostgreSQL restarts (a failover, a maintenance restart, the fault
matrix's "results store unavailable during collect") waits for it and writes once it is
back, instead of failing the cell; an outage longer than the store's wait
(``ACCELMATRIX_RESULTS_OUTAGE_SECONDS``) still fails, with the connection error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import OperationalError

from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.results.store import ResultsStore
from accelmatrix_testkit.services import PostgresServer

pytest_plugins = ["celery_services"]

DAG, RUN, CELL = "outage_dag", "run_1", "machine=a"
ROWS = [MetricValue(name="loss", step=i, value=1.0 / (i + 1)) for i in range(5)]


@pytest.fixture
def store(results_postgres) -> Iterator[ResultsStore]:
    s = ResultsStore(results_postgres.url("accelmatrix"))
    s.ensure_schema()
    s.upsert_cell(DAG, RUN, CELL, state="running")
    yield s
    results_postgres.bring_up()
    s.close()


def _back_after(results_postgres: PostgresServer, seconds: float) -> threading.Thread:
    t = threading.Thread(
        target=lambda: (time.sleep(seconds), results_postgres.bring_up()), daemon=True
    )
    t.start()
    return t


def test_a_write_during_an_outage_waits_and_lands_once(results_postgres, store, monkeypatch):
    monkeypatch.setenv("ACCELMATRIX_RESULTS_OUTAGE_SECONDS", "60")
    assert store.get_cell(DAG, RUN, CELL).state == "running"  # a pooled connection
    results_postgres.take_down()
    back = _back_after(results_postgres, 4)
    t0 = time.monotonic()
    store.replace_metrics(DAG, RUN, CELL, ROWS)
    store.upsert_cell(DAG, RUN, CELL, state="collected")
    waited = time.monotonic() - t0
    back.join()
    assert waited >= 3, f"wrote after {waited:.1f} s while the server was down 4 s"
    got = store.get_metrics(DAG, RUN, CELL)
    assert sorted(r.step for r in got) == list(range(5))  # every row, none twice
    assert store.get_cell(DAG, RUN, CELL).state == "collected"


def test_a_read_during_an_outage_waits(results_postgres, store, monkeypatch):
    monkeypatch.setenv("ACCELMATRIX_RESULTS_OUTAGE_SECONDS", "60")
    results_postgres.take_down()
    back = _back_after(results_postgres, 3)
    assert store.get_cell(DAG, RUN, CELL).state == "running"
    back.join()


def test_an_outage_longer_than_the_wait_fails(results_postgres, store, monkeypatch):
    monkeypatch.setenv("ACCELMATRIX_RESULTS_OUTAGE_SECONDS", "2")
    results_postgres.take_down()
    t0 = time.monotonic()
    with pytest.raises(OperationalError):
        store.upsert_cell(DAG, RUN, CELL, state="collected")
    assert time.monotonic() - t0 < 30
    results_postgres.bring_up()
    assert store.get_cell(DAG, RUN, CELL).state == "running"
