"""Data Docs views whose Jinja templates are compiled once per process tree, not per cell.

Why: Great Expectations builds a new Jinja ``Environment`` for every view it renders, so
every cell's Data Docs recompile the same ~40 templates. That compilation was ~0.2 s of
the ~0.3 s CPU one cell's evaluation costs (profiled on a no-op cell). These subclasses
change one thing: the environment gets a process-wide in-memory bytecode cache (Jinja's
documented hook for this, ``Environment.bytecode_cache``). ``warm_templates`` fills it:

``evaluate.warm_up`` calls it, in PreloadedLocalExecutor (accelmatrix.executor) before the
workers fork, so every task process starts with the compiled templates, and in the
triggerer's warm-up. Elsewhere the first evaluation in a process fills it. A template whose
source changed is compiled again: the bucket checks the source's checksum.

GE loads the views by name from the Data Docs site config (``gx_suite.run_suite``). This
module imports Great Expectations and is only loaded when GE already is.
"""

from __future__ import annotations

import logging
import threading
import time

from great_expectations.render.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket

log = logging.getLogger(__name__)


class MemoryBytecodeCache(BytecodeCache):
    """Compiled templates by Jinja's bucket key, in this process (inherited across fork)."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def load_bytecode(self, bucket: Bucket) -> None:
        with self._lock:
            data = self._code.get(bucket.key)
        if data is not None:
            bucket.bytecode_from_string(data)  # resets itself if the checksum differs

    def dump_bytecode(self, bucket: Bucket) -> None:
        data = bucket.bytecode_to_string()
        with self._lock:
            self._code[bucket.key] = data

    def __len__(self) -> int:
        return len(self._code)


TEMPLATES = MemoryBytecodeCache()


class CachedJinjaPageView(DefaultJinjaPageView):
    """GE's page view (validation results, expectation suites) with the shared cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = TEMPLATES


class CachedJinjaIndexPageView(DefaultJinjaIndexPageView):
    """GE's index page view with the shared cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = TEMPLATES


def warm_templates() -> int:
    """Compile every Data Docs template into the shared cache; return how many are cached."""
    started = time.perf_counter()
    env = CachedJinjaIndexPageView().env
    for name in env.list_templates():
        env.get_template(name)
    log.info(
        "compiled %d Data Docs templates in %.2f s", len(TEMPLATES), time.perf_counter() - started
    )
    return len(TEMPLATES)
