"""Data Docs that render with no network: clusters running accelmatrix are often air-gapped.

Great Expectations 1.24's site builder writes pages that load jQuery, bootstrap,
bootstrap-table, vega and fonts from public CDNs, and its ``index.html`` builds its table
with bootstrap-table from inline data: offline the index is an empty page. So after GE has
built the site:

* ``index.html`` is replaced by a static page of ours, written from the validation results
  themselves (every expectation of every table: its check, bounds, observed value, the
  offending rows, pass/fail), linking GE's per-validation and per-suite pages. No script.
* Every other generated page loses its external ``<script src>``, ``<link href>`` and
  ``<img src>`` (the GE logo comes from S3; the local copy in ``static/images`` replaces
  it) and gets a small inline stylesheet, so its server-rendered tables stay readable.
  Stylesheets' ``url(https://...)`` references are dropped. The favicon link is made to
  point at the site's copy (GE's is one directory short on validation pages).

Nothing is fetched to bundle: GE's pages are fully rendered HTML, only their styling and
widgets came from the CDNs.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["EXTERNAL", "external_refs", "make_offline"]

# A URL that leaves the machine: http(s) or protocol-relative.
_URL = r"""["']?\s*(?:https?:)?//"""
EXTERNAL = re.compile(
    rf"<script\b[^>]*\bsrc\s*=\s*{_URL}[^>]*>\s*</script\s*>"
    rf"|<link\b[^>]*\bhref\s*=\s*{_URL}[^>]*>"
    rf"|<img\b[^>]*\bsrc\s*=\s*{_URL}[^>]*>",
    re.IGNORECASE,
)
# GE's favicon link, whose "../" count GE 1.24 gets wrong on validation pages (one short).
_FAVICON = re.compile(r'href="(?:\.\./)*static/images/favicon\.ico"')
_CSS_URL = re.compile(r"""url\(\s*["']?(?:https?:)?//[^)]*\)""", re.IGNORECASE)
_LOADS = re.compile(
    rf"<(?:script|img|iframe)\b[^>]*\bsrc\s*=\s*{_URL}|<link\b[^>]*\bhref\s*=\s*{_URL}",
    re.IGNORECASE,
)

STYLE = """<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#1a202c}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #cbd5e0;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#edf2f7}.fail{background:#fed7d7}
.pass{background:#c6f6d5}img{max-height:40px}nav,.navbar,.modal,form{display:none}
code,pre{white-space:pre-wrap}
</style>"""


def external_refs(text: str) -> list[str]:
    """Tags in ``text`` that would load something from another machine (for tests)."""
    return [m.group(0) for m in _LOADS.finditer(text)]


def make_offline(docs_dir: Path, results: list[Any], suite_name: str) -> Path:
    """Rewrite the built site in ``docs_dir`` so it needs no network; returns the index."""
    pages = sorted(
        p for p in docs_dir.rglob("*.html") if p.name != "index.html" or p.parent != docs_dir
    )
    for page in pages:
        text = page.read_text(encoding="utf-8")
        logo = os.path.relpath(docs_dir / "static" / "images" / "logo-long.png", page.parent)
        text = EXTERNAL.sub(lambda m, logo=logo: _replace(m.group(0), logo), text)
        icon = os.path.relpath(docs_dir / "static" / "images" / "favicon.ico", page.parent)
        text = _FAVICON.sub(f'href="{html.escape(icon)}"', text)
        text = _CSS_URL.sub("none", text)
        text = text.replace("</head>", f"{STYLE}</head>", 1)
        page.write_text(text, encoding="utf-8")
    for css in docs_dir.rglob("*.css"):
        text = css.read_text(encoding="utf-8")
        css.write_text(_CSS_URL.sub("none", text), encoding="utf-8")
    index = docs_dir / "index.html"
    index.write_text(_index(docs_dir, pages, results, suite_name), encoding="utf-8")
    return index


def _replace(tag: str, logo: str) -> str:
    if tag.lower().startswith("<img") and "logo" in tag.lower():
        return f'<img src="{html.escape(logo)}" alt="Great Expectations">'
    return ""


MAX_ROWS_SHOWN = 10  # offending rows listed per expectation on the index


def _offending(result: Any) -> str:
    """The rows GE found unexpected, as ``step=value``, capped: what the verdict names."""
    res = result.result or {}
    rows = res.get("unexpected_index_list") or []
    column = (result.expectation_config.kwargs or {}).get("column")
    shown = []
    for row in rows[:MAX_ROWS_SHOWN]:
        if isinstance(row, dict):
            where = ", ".join(f"{k}={v}" for k, v in row.items() if k != column)
            shown.append(f"{where}: {row.get(column)}")
    count = res.get("unexpected_count")
    if count and count > len(shown):
        shown.append(f"... ({count} rows in all)")
    return "; ".join(shown)


def _index(docs_dir: Path, pages: list[Path], results: list[Any], suite_name: str) -> str:
    """Our index: the title names the cell as it is (``suite.model=a,config=b``, not GE's
    path-safe key), the summary counts checks as the verdict table and the matrix page do
    (a check is one or more expectations and passes when all of them do), and the failing
    checks come first."""
    esc = html.escape
    checks: dict[Any, list[Any]] = {}
    for r in (r for result in results for r in getattr(result, "results", []) or []):
        meta = r.expectation_config.meta or {}
        checks.setdefault(meta.get("check_index", meta.get("check", "")), []).append(r)
    # Failing checks first, each group in the suite's order (results come table by table).
    in_order = [checks[k] for k in sorted(checks, key=lambda k: (isinstance(k, str), k))]
    ordered = sorted(in_order, key=lambda rs: all(bool(r.success) for r in rs))
    rows = []
    failed_names = []
    for rs in ordered:
        if not all(bool(r.success) for r in rs):
            failed_names.append(str((rs[0].expectation_config.meta or {}).get("check", "")))
        for r in sorted(rs, key=lambda r: bool(r.success)):  # its failing expectation first
            cfg = r.expectation_config
            meta = cfg.meta or {}
            kwargs = cfg.kwargs or {}
            bounds = ", ".join(
                f"{k}={kwargs[k]}" for k in ("min_value", "max_value") if kwargs.get(k) is not None
            )
            observed = (r.result or {}).get("observed_value")
            ok = bool(r.success)
            rows.append(
                f'<tr class="{"pass" if ok else "fail"}"><td>{esc(str(meta.get("check", "")))}</td>'
                f"<td>{esc(str(cfg.type))}<br><code>{esc(str(kwargs.get('column', '')))}</code></td>"
                f"<td>{esc(bounds)}</td><td>{esc(str(observed))}</td>"
                f"<td>{esc(_offending(r))}</td>"
                f"<td>{'PASS' if ok else 'FAIL'}</td></tr>"
            )
    links = "".join(
        f'<li><a href="{esc(p.relative_to(docs_dir).as_posix())}">'
        f"{esc(p.relative_to(docs_dir).as_posix())}</a></li>"
        for p in pages
    )
    n, bad = len(checks), len(failed_names)
    summary = f"{n - bad} of {n} check{'s' if n != 1 else ''} passed"
    if bad:
        summary = f"{bad} of {n} check{'s' if n != 1 else ''} failed: " + ", ".join(failed_names)
    ok = all(getattr(result, "success", False) for result in results)
    verdict = "failed" if bad or not ok else "passed"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Data Docs of {esc(suite_name)}</title>{STYLE}</head><body>"
        f"<h1>Data Docs of {esc(suite_name)}</h1>"
        f'<p id="summary">Validation {verdict}: {esc(summary)}.</p>'
        '<table id="expectations"><tr><th>check</th><th>expectation</th><th>bounds</th>'
        f"<th>observed</th><th>offending rows</th><th>result</th></tr>{''.join(rows)}</table>"
        f"<h2>Great Expectations pages</h2><ul>{links}</ul>"
        "<p>Written for machines without internet access: no script, nothing loaded from "
        "elsewhere.</p></body></html>"
    )
