"""Bring a results database to the newest schema with Alembic, on a connection the caller
holds.

The store calls :func:`upgrade` once per process, inside its schema transaction and lock
(``ResultsStore.ensure_schema``), so many task processes opening a fresh database at once
run the migrations one after the other and every later one finds the database at head.
Alembic is configured in code (no ini file is needed at run time): the scripts live in
``accelmatrix/results/migrations`` and ship with the package.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, MetaData, String, Table, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

SCRIPT_LOCATION = Path(__file__).resolve().parent / "migrations"


def config(connection: Connection | None = None) -> Config:
    """Alembic's config for our scripts; ``connection`` is migrated instead of a new one."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head() -> str:
    """The newest revision of the scripts (read once per process)."""
    rev = ScriptDirectory.from_config(config()).get_current_head()
    assert rev is not None, "the migrations folder has no revision"
    return rev


def current(connection: Connection) -> str | None:
    """The revision the database is at; None for an empty or pre-Alembic database."""
    return MigrationContext.configure(connection).get_current_revision()


def at_head(connection: Connection) -> bool:
    """Whether the database is at the newest revision (a read: no lock, no transaction)."""
    return current(connection) == head()


# Alembic's version table as Alembic creates it; read directly by is_at_head.
_VERSION_TABLE = Table("alembic_version", MetaData(), Column("version_num", String(32)))


def is_at_head(connection: Connection) -> bool:
    """at_head in one SELECT, for a connection the caller throws away afterwards.

    Every task process asks this once when it opens the store. Alembic's own question
    (``MigrationContext.configure(...).get_current_revision()``) costs ~10 ms of CPU for
    its setup, half of a warm task's store opening; the answer is the version table's one
    row. A missing table (a fresh or pre-Alembic database) raises, and counts as "not at
    head": the caller then takes the schema lock and lets Alembic (:func:`upgrade`)
    decide. The failed statement may leave the connection's transaction aborted
    (PostgreSQL), hence a connection of its own.
    """
    try:
        versions = connection.execute(select(_VERSION_TABLE.c.version_num)).scalars().all()
    except DBAPIError:
        return False
    return versions == [head()]


def upgrade(connection: Connection) -> bool:
    """Upgrade to head on ``connection`` (its open transaction); True when anything ran.

    The revision check first: a database already at head (every open but the first) costs
    one SELECT, not loading and running Alembic's environment.
    """
    if at_head(connection):
        return False
    command.upgrade(config(connection), "head")
    return True
