"""Data Docs building blocks that keep a cell's Data Docs cheap: views whose Jinja templates
are compiled once per process tree, and a site builder that copies only the files the pages use.

Why: Great Expectations builds a new Jinja ``Environment`` for every view it renders, so
every cell's Data Docs recompile the same ~40 templates. That compilation was ~0.2 s of
the ~0.3 s CPU one cell's evaluation costs (profiled on a no-op cell). These subclasses
change one thing: the environment gets a process-wide in-memory bytecode cache (Jinja's
documented hook for this, ``Environment.bytecode_cache``). ``warm_templates`` fills it:

``evaluate.warm_up`` calls it, in PreloadedLocalExecutor (accelmatrix.deploy.executor) before the
workers fork, so every task process starts with the compiled templates, and in the
triggerer's warm-up. Elsewhere the first evaluation in a process fills it. A template whose
source changed is compiled again: the bucket checks the source's checksum.

``LeanSiteBuilder``: GE's SiteBuilder copies its whole static tree into every site, 4 MiB of
fonts, animated GIFs and SVG logos, while the pages (once ``offline_docs`` has rewritten them)
link two files of it: the favicon and the logo. At one site per cell that was 1 GiB of
artifacts for a 256-cell run. This builder copies those two files only.

GE loads these classes by name from the Data Docs site config (``gx_suite.run_suite``). This
module imports Great Expectations and is only loaded when GE already is.
"""

from __future__ import annotations

import logging
import mimetypes
import threading
import time
from pathlib import Path
from typing import Any

import great_expectations.render.view as ge_views
from great_expectations.render.renderer.site_builder import SiteBuilder
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


# The static files a page links after offline_docs has rewritten it (GE's favicon template;
# offline_docs points the logo at the local copy). Paths under GE's static directory.
PAGE_ASSETS = (("images", "favicon.ico"), ("images", "logo-long.png"))
_GE_STATIC = Path(ge_views.__file__).parent / "static"


class LeanSiteBuilder(SiteBuilder):
    """GE's SiteBuilder, copying only PAGE_ASSETS of GE's static tree (14 KiB, not 4 MiB).

    ``build`` is GE 1.x's own, section pages then static files then index, with the copy
    narrowed: HtmlSiteStore.copy_static_assets has no way to choose files.
    """

    def build(self, resource_identifiers: Any = None, build_index: bool = True) -> Any:
        for section_builder in self.site_section_builders.values():
            section_builder.build(resource_identifiers=resource_identifiers)
        assets = self.target_store.store_backends["static_assets"]
        for parts in PAGE_ASSETS:
            content_type, encoding = mimetypes.guess_type(parts[-1], strict=False)
            assets.set(
                ("static", *parts),
                _GE_STATIC.joinpath(*parts).read_bytes(),
                content_encoding=encoding,
                content_type=content_type,
            )
        _, index_links = self.site_index_builder.build(build_index=build_index)
        return self.get_resource_url(only_if_exists=False), index_links
