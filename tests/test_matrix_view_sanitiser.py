"""The matrix view's sanitiser (ui/static/matrix-view.js) judges a URL attribute as the
browser will follow it: parsed by the WHATWG URL parser (Node's is the same standard as the
browser's), after the DOM parser decoded its entities. Measured on 1a86892: it checked the
raw value for a ``javascript:`` prefix, so ``java&#x09;script:`` (a tab once decoded, which
the URL parser removes) passed.

The values below are what ``DOMParser`` hands the sanitiser: entities already decoded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import needs

SCRIPT = Path(__file__).resolve().parents[1] / "plugins/accelmatrix/ui/static/matrix-view.js"

DROPPED = [
    "javascript:alert(1)",
    "java\tscript:alert(1)",  # java&#x09;script:
    "java\nscript:alert(1)",  # java&#x0A;script:
    "  JaVaScRiPt:alert(1)",
    "\x01javascript:alert(1)",  # a leading control character, trimmed by the URL parser
    "vbscript:msgbox(1)",
    "data:text/html,<script>alert(1)</script>",
    "blob:http://127.0.0.1/x",
    "file:///etc/passwd",
]
KEPT = [
    "https://example.com/x",
    "http://127.0.0.1:8080/accelmatrix/suites/s?run_id=r",
    "/accelmatrix/suites/s",
    "?run_id=pr-7",
    "#cell-1",
    "files/index.html",
    "mailto:oncall@example.com",
    # Not decoded twice: "&" and "#" cannot be in a scheme, so a relative http URL.
    "jav&#x61;script:alert(1)",
]


def test_the_sanitiser_judges_urls_as_the_browser_parses_them() -> None:
    node = needs.tool("node", "node")
    source = SCRIPT.read_text()
    judge = source[source.index("const SAFE_SCHEMES") : source.index("function sanitize(")]
    program = (
        "const document = { baseURI: 'http://127.0.0.1:8080/' };\n"
        + judge
        + "\nconst values = JSON.parse(process.argv[1]);\n"
        + "console.log(JSON.stringify(values.map((v) => [safeUrl(v, 'a', 'href'),"
        + " safeUrl(v, 'img', 'src')])));\n"
    )
    img = "data:image/png;base64,iVBORw0KGgo="
    values = [*DROPPED, *KEPT, img]
    out = subprocess.run(
        [node, "-e", program, json.dumps(values)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    verdicts = dict(zip(values, json.loads(out.stdout), strict=True))
    assert [v for v in DROPPED if any(verdicts[v])] == []
    assert [v for v in KEPT if not all(verdicts[v])] == []
    assert verdicts[img] == [False, True]  # an inline image, as an image only
