"""Hostile and broken suite YAML, fuzzed with hypothesis.

Whatever a suite file holds, loading it either gives a valid Suite or raises SuiteError
naming the file (and, for schema problems, the field path and the allowed values): never
another exception type. A broken file becomes the paused invalid-suite DAG, which runs
nothing, and never stops the other suites from loading. UI params holding shell syntax or
placeholders reach the workload verbatim, as one argv element.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accelmatrix.spec.loader import SuiteError, load_suite

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BASE: dict[str, Any] = {
    "description": "fuzz base",
    "axes": {"model": {"a": {"arch": "mlp"}, "b": {"arch": "wide"}}, "seed": [1, 2]},
    "machines": {"cpu": {"backend": "local"}},
    "params": {"steps": {"type": "integer", "default": 3}},
    "workload": {
        "setup": [["${python}", "-c", "print(1)"]],
        "run": ["${python}", "-c", "print('${axis.model.arch}')", "${params.steps}"],
        "env": {"MODEL": "${axis.model}"},
        "artifacts": ["out/**"],
        "timeout": 60,
    },
    "checks": [{"type": "log_contains", "pattern": "ok"}],
}

# Strings a hostile author (or a pasted command) might put anywhere.
NASTY = st.sampled_from(
    [
        "$(touch PWNED)",
        "; touch PWNED",
        "`touch PWNED`",
        "a\nb",
        "x' \"; rm -rf / #",
        "${python}",
        "${axis.nope}",
        "../../etc/passwd",
        "/etc/shadow",
        "*",
        "",
        " ",
        "\x00",
        "\x1b[31m",
        "é\u202e",
        "a" * 300,
    ]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), NASTY, st.text(max_size=20)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _write(tmp: Path, data: Any, name: str = "fuzzed") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, allow_unicode=True))
    return path


def _load_or_suite_error(path: Path) -> SuiteError | None:
    """Load; the SuiteError if there is one. Any other exception fails the test."""
    try:
        load_suite(path)
    except SuiteError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        assert str(e).startswith(f"{path}: invalid suite")
        return e
    return None


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return obj


def test_base_suite_is_valid(tmp_path):
    assert _load_or_suite_error(_write(tmp_path, BASE)) is None


@FUZZ
@given(text=st.text(max_size=400))
def test_arbitrary_text_is_a_suite_or_a_suite_error(tmp_path, text):
    _load_or_suite_error(_write(tmp_path, text))


@FUZZ
@given(
    lines=st.lists(
        st.sampled_from(
            [
                "axes:",
                "  model: [a, b]",
                "machines: {cpu: {backend: local}}",
                "workload:",
                "  run: [python]",
                "  run: [",
                "\t- x",
                "key: value: other",
                "- - -",
                "&a *a",
                "!!python/object:os.system ls",
                "{{{",
                "'unterminated",
                "axes: {x: [1]}",
            ]
        ),
        max_size=8,
    )
)
def test_malformed_yaml_is_a_suite_error(tmp_path, lines):
    _load_or_suite_error(_write(tmp_path, "\n".join(lines)))


@FUZZ
@given(data=st.data())
def test_any_field_with_any_value(tmp_path, data):
    """Wrong types and hostile strings in every position of a valid suite."""
    suite = copy.deepcopy(BASE)
    path = data.draw(st.sampled_from(_paths(suite)[1:]))
    value = data.draw(VALUES)
    _load_or_suite_error(_write(tmp_path, _set(suite, path, value)))


@FUZZ
@given(data=st.data(), value=NASTY)
def test_shell_metacharacters_in_every_string(tmp_path, data, value):
    """A string field holding shell syntax is either refused or kept as plain data."""
    suite = copy.deepcopy(BASE)
    strings = [p for p in _paths(suite)[1:] if isinstance(_get(suite, p), str)]
    path = data.draw(st.sampled_from(strings))
    _set(suite, path, value)
    _load_or_suite_error(_write(tmp_path, suite))


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


@FUZZ
@given(
    where=st.sampled_from(
        [(), ("workload",), ("machines", "cpu"), ("checks", 0), ("params", "steps")]
    ),
    key=st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
)
def test_unknown_keys_name_the_field_and_the_allowed_ones(tmp_path, where, key):
    suite = copy.deepcopy(BASE)
    target = _get(suite, where)
    if key in target:
        return
    target[key] = 1
    err = _load_or_suite_error(_write(tmp_path, suite))
    assert err is not None
    loc = ".".join(str(p) for p in where if not isinstance(p, int))
    text = "\n".join(err.problems)
    assert f"unknown field {key!r}" in text or key in text, text
    assert "allowed" in text, text
    if loc:
        assert loc.split(".")[0] in text, text


@FUZZ
@given(
    backend=st.text(min_size=1, max_size=12).filter(
        lambda b: b not in ("local", "ssh", "tpu-vm", "k8s-job")
    )
)
def test_unknown_backend_lists_the_allowed_ones(tmp_path, backend):
    suite = copy.deepcopy(BASE)
    suite["machines"]["cpu"] = {"backend": backend}
    err = _load_or_suite_error(_write(tmp_path, suite))
    assert err is not None
    text = "\n".join(err.problems)
    assert "machines.cpu.backend" in text, text
    for allowed in ("local", "ssh", "tpu-vm", "k8s-job"):
        assert allowed in text, text


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(a=st.integers(33, 64), b=st.integers(33, 64))
def test_a_matrix_over_max_map_length_is_refused(tmp_path, a, b):
    suite = copy.deepcopy(BASE)
    suite["axes"] = {**suite["axes"], "x": list(range(a)), "y": list(range(b))}
    err = _load_or_suite_error(_write(tmp_path, suite))
    assert err is not None and "1024" in str(err), err


@pytest.mark.parametrize(
    "glob", ["../out/**", "/etc/passwd", "out/../../x", "a/..\\..\\b", "..", "out/../.."]
)
def test_artifact_globs_escaping_the_work_dir(tmp_path, glob):
    suite = copy.deepcopy(BASE)
    suite["workload"]["artifacts"] = [glob]
    err = _load_or_suite_error(_write(tmp_path, suite))
    assert err is not None and "workload.artifacts" in str(err) and "work dir" in str(err)


def test_duplicate_cell_ids_are_refused(tmp_path):
    dup_values = copy.deepcopy(BASE)
    dup_values["axes"]["seed"] = [1, 1]
    err = _load_or_suite_error(_write(tmp_path, dup_values))
    assert err is not None and "duplicate values" in str(err)
    # The same mapping key twice (YAML would silently keep the last one).
    text = yaml.safe_dump(BASE).replace("  b:\n", "  a:\n", 1)
    err = _load_or_suite_error(_write(tmp_path, text, "dupkey"))
    assert err is not None and "duplicate key" in str(err)
    # Two spellings that are the same cell id label ("1" and 1).
    err = _load_or_suite_error(
        _write(
            tmp_path,
            {**copy.deepcopy(BASE), "axes": {**BASE["axes"], "seed": [1, "1"]}},
            "duplabel",
        )
    )
    assert err is not None and "duplicate" in str(err)


@FUZZ
@given(value=st.text(max_size=60) | NASTY)
def test_ui_params_reach_argv_verbatim(value):
    """Any string a person types in the trigger form is one argv element, unchanged."""
    from accelmatrix.spec.plan import expand
    from accelmatrix.spec.suite import Suite
    from accelmatrix.spec.templating import render_tree

    if "\x00" in value:
        return  # argv cannot hold NUL; Airflow's form cannot send it either
    suite = Suite.model_validate(
        {
            "axes": {"a": [1]},
            "machines": {"cpu": {"backend": "local"}},
            "params": {"note": {"type": "string", "default": "x"}},
            "workload": {
                "run": ["${python}", "${params.note}", "[${params.note}]"],
                "env": {"NOTE": "${params.note}"},
            },
        }
    )
    (cell,) = expand(suite, "d", params={"note": value}).cells
    backend_vars = {"python": "PY", "work_dir": "W", "include_dir": "I", "num_workers": "1"}
    assert render_tree(cell.workload.run, backend_vars) == ["PY", value, f"[{value}]"]
    assert render_tree(cell.workload.env, backend_vars) == {"NOTE": value}


HOSTILE_FILES = {
    "broken_yaml": "axes: [\n  - {",
    "wrong_types": yaml.safe_dump({**BASE, "axes": "everything", "workload": {"run": 5}}),
    "unknown_backend": yaml.safe_dump({**BASE, "machines": {"cpu": {"backend": "mainframe"}}}),
    "shell_everywhere": yaml.safe_dump(
        {**BASE, "tags": ["$(touch PWNED)\n"], "machine": "; touch PWNED"}
    ),
    "too_many_cells": yaml.safe_dump(
        {**BASE, "axes": {**BASE["axes"], "x": list(range(40)), "y": list(range(40))}}
    ),
}


@pytest.mark.integration
def test_hostile_files_do_not_stop_the_good_suites(airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    suites = tmp_path / "suites"
    suites.mkdir()
    good = ["local_smoke", "inference"]
    for name in good:
        shutil.copy(ROOT / "include" / "suites" / f"{name}.yaml", suites)
    for name, text in HOSTILE_FILES.items():
        (suites / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(suites))
    bag = DagBag(dag_folder=str(ROOT / "dags" / "accelmatrix_suites.py"), safe_mode=False)
    assert bag.import_errors == {}
    for name in good:
        assert "invalid-suite" not in bag.dags[name].tags
    for name in HOSTILE_FILES:
        dag = bag.dags[name]
        assert "invalid-suite" in dag.tags, name
        assert [t.task_id for t in dag.tasks] == ["suite_invalid"]  # nothing else can run
        assert str(suites / f"{name}.yaml") in dag.doc_md or name in dag.doc_md
        assert re.search(r"INVALID SUITE: \S", dag.description), dag.description


# -- the workload side: metric files and cell ids ---------------------------------------------
# Keys a workload might write: its own names, the runner's (bare and namespaced), odd text.
METRIC_KEYS = st.sampled_from(
    ["loss", "wall_seconds", "cpu_percent", "runner.wall_seconds", "step", "acc", "é", ""]
) | st.text(max_size=6)
METRIC_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),  # beyond a float: becomes +-inf
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1.5", "nan", "", "x"]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
METRIC_FILES = st.fixed_dictionaries(
    {
        "json": st.dictionaries(METRIC_KEYS, METRIC_VALUES, max_size=6),
        "jsonl": st.lists(
            st.dictionaries(METRIC_KEYS, METRIC_VALUES, max_size=4).map(
                lambda d: d  # a line's own "step" key may be missing, repeated or not an int
            ),
            max_size=6,
        ),
        "resources": st.lists(st.floats(min_value=0, max_value=100), max_size=3),
    }
)


def _is_number(v: Any) -> bool:
    """What the collector reads as a metric value (strict-JSON spellings of NaN included)."""
    return (isinstance(v, int | float) and not isinstance(v, bool)) or v in (
        "NaN",
        "Infinity",
        "-Infinity",
    )


def _dump(obj: Any) -> str:
    # Python's json writes NaN/Infinity bare, as a careless workload would.
    return json.dumps(obj, default=str)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=METRIC_FILES)
# Found by this test: steps the results store's 64-bit integer column cannot hold.
@example(files={"json": {}, "jsonl": [{"loss": 0.0, "step": 2**63}], "resources": []})
@example(files={"json": {}, "jsonl": [{"loss": 0.0, "step": -1}], "resources": []})
def test_hostile_metric_files_never_crash_collect_and_lose_nothing_silently(tmp_path, files):
    """Whatever a workload writes, collecting never raises, the rows fit the results store
    (one value per (name, step), every value a float), the runner's namespace holds only the
    runner's samples, and every value read but not kept is named in an error."""
    from accelmatrix.metrics.resource_samples import resource_rows
    from accelmatrix.metrics.sources import collect_metrics, parse_metric_sources
    from accelmatrix.results.store import ResultsStore

    work = Path(tempfile.mkdtemp(dir=tmp_path))
    (work / "m.json").write_text(_dump(files["json"]))
    (work / "m.jsonl").write_text("\n".join(_dump(line) for line in files["jsonl"]) + "\n")
    samples = [{"step": i, "cpu_percent": v} for i, v in enumerate(files["resources"])]
    final = {"final": True, "wall_seconds": 1.0, "cpu_seconds": 0.5, "peak_rss_mb": 10}
    (work / "resources.jsonl").write_text("\n".join(map(json.dumps, [*samples, final])))
    sources = parse_metric_sources(
        [{"type": "json", "path": "m.json"}, {"type": "jsonl", "path": "m.jsonl"}]
    )
    got = collect_metrics(
        sources,
        files_dir=work,
        log_path=None,
        extra_rows=resource_rows(work / "resources.jsonl"),
    )
    keys = [(r["name"], r["step"]) for r in got.rows]
    assert len(keys) == len(set(keys))
    assert all(isinstance(r["value"], float) for r in got.rows)
    for r in got.rows:
        assert r["name"].startswith("runner.") == (r["source"] == "resources"), r
    assert {n for n, s in keys if s is None} >= {"runner.wall_seconds", "runner.cpu_seconds"}
    # A workload's own wall_seconds is kept beside the runner's, never instead of it.
    own = files["json"].get("wall_seconds")
    if isinstance(own, float) and own == own:  # a real number (not NaN)
        assert ("wall_seconds", None) in keys
    numbers = {k: v for k, v in files["json"].items() if _is_number(v)}
    if any(k.startswith("runner.") for k in numbers):
        assert any("reserved namespace 'runner.'" in e for e in got.errors)
    # Every number of the json file is stored, or named in an error.
    for key in numbers:
        if (key, None) not in keys:
            assert any(repr(key) in e for e in got.errors), (key, got.errors)
    # The rows are exactly what the store can hold (a step logged twice is one row, its
    # repeats counted in metrics.json only), and metrics.json stays strict JSON.
    store = ResultsStore(f"sqlite:///{work / 'r.db'}")
    assert store.replace_metrics("d", "r", "c", got.store_rows()) == len(got.rows)
    json.dumps(got.rows, default=str)


@settings(max_examples=60, deadline=None)
@given(
    base=st.text(alphabet="abc-=,.", min_size=1, max_size=8),
    marks=st.lists(st.sampled_from(list("+:/ _@#~*?%'\"\\")), min_size=2, max_size=6, unique=True),
)
def test_ids_differing_only_in_punctuation_get_different_directories(base, marks):
    """Every id a sanitizer would map to one string still gets its own path component."""
    from accelmatrix import settings as am_settings

    ids = [f"{base}{m}x" for m in marks] + [f"{base}_x"]
    names = [am_settings.safe_name(i) for i in ids]
    assert len(set(names)) == len(set(ids)), dict(zip(ids, names, strict=True))
    assert all("/" not in n and n not in (".", "..") for n in names)
