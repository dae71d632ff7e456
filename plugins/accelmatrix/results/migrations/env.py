"""Alembic's environment: migrate the connection the store hands over, or the configured URL.

The store runs migrations inside its own schema transaction (BEGIN IMMEDIATE on SQLite, an
advisory lock on PostgreSQL), so concurrent task processes opening a fresh database
serialise on that lock: the connection arrives in ``config.attributes["connection"]`` with
the transaction already open, and Alembic then opens none of its own. From the ``alembic``
command line (new revisions, by hand) the URL comes from ACCELMATRIX_RESULTS_URL.

No ``logging.config.fileConfig`` here: this runs inside Airflow task processes, whose
logging Airflow owns.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from accelmatrix import settings
from accelmatrix.results.schema import metadata

config = context.config


def _run(connection) -> None:  # noqa: ANN001 - alembic's own env.py shape
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=settings.results_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    _run(conn)
else:
    engine = create_engine(settings.results_url())
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()
