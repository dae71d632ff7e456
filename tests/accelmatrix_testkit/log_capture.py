"""Log lines of one accelmatrix logger, captured where pytest's ``caplog`` cannot see them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def logged(
    name: str = "accelmatrix.lifecycle", level: int = logging.WARNING
) -> Iterator[list[str]]:
    """The messages of ``level`` and above logged to ``name`` (or below it) meanwhile.

    A handler on the logger itself: once Airflow's logging config is loaded (any module that
    imports a provider hook loads it), records go to Airflow's own stdout handler and do not
    reach the root logger, where ``caplog`` listens.
    """
    lines: list[str] = []
    handler = logging.Handler(level)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
