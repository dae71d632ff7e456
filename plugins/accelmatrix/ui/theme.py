"""The matrix pages' dark theme, following Airflow's.

Airflow 3.3.2's UI keeps its color mode with next-themes (``attribute: "class"``): the
document element carries ``class="dark"`` or ``class="light"`` (the user's choice, or the
system's when "system" is chosen). The navigation entry's view (static/matrix-view.js)
renders the page into a shadow root, which Airflow's CSS does not reach, and mirrors that
class onto its host element as ``am-dark``; the rules below then apply as ``:host(.am-dark)
...``. A page opened on its own (no Airflow around it, no script) follows the browser's
``prefers-color-scheme`` instead, scoped under ``body`` so that inside the shadow root (which
has no body) only Airflow's choice counts.

One list of overrides, written out twice; the light colours stay in render.CSS.
"""

from __future__ import annotations

# (selector, declarations): the dark colours of everything the light CSS colours.
DARK_RULES: tuple[tuple[str, str], ...] = (
    ("a", "color:#90cdf4"),
    ("table.suites td,table.suites th", "border-bottom-color:#4a5568"),
    (".gridwrap", "border-color:#4a5568"),
    (
        "table.grid th,table.history th",
        "background:#2d3748;border-color:#4a5568;color:#e2e8f0",
    ),
    ("table.grid td.cell", "border-color:#4a5568"),
    (".k-passed", "background:#1c4532"),
    (".k-failed", "background:#822727"),
    (".k-infra", "background:#7b341e"),
    (".k-quarantined", "background:#44337a"),
    (".k-flaky", "background:#744210"),
    (".k-excluded", "background:#2d3748;color:#a0aec0"),
    (".k-pending", "background:#2a4365"),
    (".k-cancelled", "background:#4a5568"),
    (".k-none", "background:transparent"),
    ("td.cell .why", "color:#e2e8f0"),
    ("td.cell .attempt", "color:#cbd5e0"),
    (".swatch", "border-color:#718096"),
    (".meta,.filters .shown,.rerun .none,.rerun .denied", "color:#a0aec0"),
    ("p.rerun-note", "background:#1a365d;border-left-color:#63b3ed"),
    ("svg.trend", "background:#1a202c"),
    ("svg.trend .plot", "fill:#1a202c;stroke:#4a5568"),
    ("svg.trend .gridline", "stroke:#2d3748"),
    ("svg.trend .tick", "fill:#a0aec0"),
    ("svg.trend .band", "fill:#276749"),
    ("svg.trend .current", "stroke:#68d391"),
    ("svg.trend .mark", "fill:#feb2b2"),
    # the culprit report (ui/op_diff_view.py); its bar chart is a `trend` svg
    ("section.culprit,table.siblings td,table.siblings th", "border-color:#4a5568"),
    ("section.culprit .sub", "color:#a0aec0"),
    ("svg.opdiff-bars .zero", "stroke:#a0aec0"),
    ("ul.series-legend .s-regression .status", "color:#feb2b2"),
    ("ul.series-legend .s-flaky .status", "color:#f6e05e"),
    (
        "input,select,button",
        "background:#2d3748;color:#e2e8f0;border:1px solid #4a5568",
    ),
)
PAGE_BACKGROUND = "background:#1a202c;color:#e2e8f0;color-scheme:dark"
LIGHT_BACKGROUND = "background:#fff"


def _scoped(prefix: str) -> str:
    out = []
    for selector, decls in DARK_RULES:
        scoped = ",".join(f"{prefix} {s.strip()}" for s in selector.split(","))
        out.append(f"{scoped}{{{decls}}}")
    return "".join(out)


# The view's host: white like the page in light mode, Airflow's dark background in dark
# mode (the host's own inline style sets no background, so these apply).
CSS = (
    f":host{{display:block;{LIGHT_BACKGROUND}}}"
    f":host(.am-dark),:host(.am-dark) .am-body{{{PAGE_BACKGROUND}}}"
    + _scoped(":host(.am-dark)")
    + f"@media (prefers-color-scheme: dark){{body{{{PAGE_BACKGROUND}}}{_scoped('body')}}}"
)
