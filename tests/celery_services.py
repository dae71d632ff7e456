"""Fixtures for the Celery stacks: a PostgreSQL and a Redis of their own on loopback.

The deployment docker-compose.yaml describes (Airflow's metadata DB, the Celery result
backend and the results store on PostgreSQL, Redis as the broker), from Debian's packages.
A machine without them skips the tests that use these, loudly (needs.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from needs import missing

from accelmatrix_testkit.services import PostgresServer, RedisServer, ServiceUnavailable


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except ServiceUnavailable as e:
        missing("celery", str(e))
    with server:
        yield server


@pytest.fixture(scope="module")
def results_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL with an ``accelmatrix`` database for the results store, shared by a
    module's tests (the store tests that need a real server)."""
    try:
        server = PostgresServer(databases=("accelmatrix",))
    except ServiceUnavailable as e:
        missing("celery", str(e))
    with server:
        yield server


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    try:
        server = RedisServer()
    except ServiceUnavailable as e:
        missing("celery", str(e))
    with server:
        yield server
