"""accelmatrix as a package dropped into an existing Airflow, with no checkout behind it.

Most users already run Airflow (Cloud Composer, Astro, MWAA, a Helm chart): they install
the wheel, copy one DAG file into their dags folder and keep their suites in a directory
of their own (docs/deploy.md, "Adding accelmatrix to an existing Airflow deployment").
Everything else in this test suite runs the package from the checkout's plugins folder,
which would hide a module that reads a file beside the repository, a plugin that is only
found in the plugins folder, or package data the wheel leaves out. So this test builds the
wheel from a copy of the sources, installs it into a fresh virtual environment that sees
Airflow and the dependencies of the shared one but neither the checkout nor its editable
install, and asks that environment's Airflow for the plugin and the DAGs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from needs import missing

ROOT = Path(__file__).resolve().parents[1]
SHARED_SITE = Path(sysconfig.get_paths()["purelib"])
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.integration


def _run(argv: list[str | Path], env: dict[str, str] | None = None, timeout: int = 180) -> str:
    r = subprocess.run(  # noqa: S603 - argv lists of our own
        [str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, f"{argv}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _hidden(name: str) -> bool:
    """The shared venv's own accelmatrix: its dist-info and the editable install's .pth
    that puts a checkout's plugins folder on sys.path."""
    return name.startswith(("accelmatrix", "__editable__.accelmatrix", "__editable___accelmatrix"))


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(python of a fresh venv with the wheel installed, that venv's site-packages)."""
    tmp = tmp_path_factory.mktemp("installed")
    # The sources the wheel is built from, copied: the build writes build/ and egg-info
    # beside them, and other tests read the checkout meanwhile.
    src = tmp / "src"
    (src / "plugins").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(
        ROOT / "plugins" / "accelmatrix",
        src / "plugins" / "accelmatrix",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    wheels = tmp / "wheels"
    try:
        # Offline: no build isolation (it would download setuptools), no index.
        _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["--no-index", "-w", wheels, src]
        )
    except AssertionError as e:
        if "setuptools" in str(e) and "No module named" in str(e):
            missing("venv", f"cannot build a wheel offline here (no setuptools): {e}")
        raise
    (wheel,) = wheels.glob("accelmatrix-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    site = venv / "lib" / PY / "site-packages"
    # Airflow and every dependency, as if installed in this venv (their .pth hooks run
    # too), but not the shared venv's accelmatrix.
    for entry in SHARED_SITE.iterdir():
        if not _hidden(entry.name) and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    return python, site


def _report(argv: list[str | Path], env: dict[str, str]) -> dict:
    """The JSON a script prints last (Airflow logs to stdout before it)."""
    return json.loads(_run(argv, env).strip().splitlines()[-1])


def _env(tmp: Path, plugins: Path) -> dict[str, str]:
    """An Airflow home in tmp, nothing inherited that could point at the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "_AIRFLOW", "ACCELMATRIX_")) and k != "PYTHONPATH"
    }
    home = tmp / "airflow_home"
    (home / "dags").mkdir(parents=True, exist_ok=True)
    plugins.mkdir(parents=True, exist_ok=True)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(plugins),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        GX_ANALYTICS_ENABLED="False",
    )
    return env


PLUGINS_REPORT = (
    "import json, accelmatrix\n"
    "from airflow import plugins_manager\n"
    "info = plugins_manager.get_plugin_info()\n"
    "print(json.dumps({'file': accelmatrix.__file__,\n"
    "  'plugins': [{'name': p['name'], 'source': str(p.get('source'))} for p in info],\n"
    "  'errors': plugins_manager.get_import_errors()}))\n"
)


def test_the_package_imports_from_its_install_not_the_checkout(
    clean_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    python, site = clean_venv
    out = _run([python, "-c", "import accelmatrix; print(accelmatrix.__file__)"])
    file = Path(out.strip())
    assert file.is_relative_to(site), file
    assert not file.resolve().is_relative_to(ROOT), file


def test_airflow_finds_the_plugin_through_the_entry_point(
    clean_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """An empty plugins folder: the matrix page comes from the installed package alone."""
    python, site = clean_venv
    report = _report([python, "-c", PLUGINS_REPORT], _env(tmp_path, tmp_path / "p"))
    assert Path(report["file"]).is_relative_to(site)
    ours = [p for p in report["plugins"] if p["name"] == "accelmatrix"]
    assert len(ours) == 1, report
    assert "accelmatrix.ui.plugin:AccelmatrixPlugin" in ours[0]["source"], ours
    assert report["errors"] == {}, report["errors"]


def test_a_checkout_plugins_folder_beside_the_install_registers_the_plugin_once(
    clean_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """The repository's plugins folder (its shim) with the entry point installed: the shim
    steps aside, so the plugin is registered once and no plugin import error is reported
    (Airflow skips a second registration but lists it as an error in the UI)."""
    python, _ = clean_venv
    env = _env(tmp_path, ROOT / "plugins")
    report = _report([python, "-c", PLUGINS_REPORT], env)
    ours = [p for p in report["plugins"] if p["name"] == "accelmatrix"]
    assert len(ours) == 1, report
    assert "accelmatrix.ui.plugin:AccelmatrixPlugin" in ours[0]["source"], ours
    assert report["errors"] == {}, report["errors"]


def test_the_one_dag_file_builds_the_suites_dag_from_airflow_home_include(
    clean_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """The DAG files copied into an empty dags folder, a suite in $AIRFLOW_HOME/include/suites
    (the installed package's default include dir), no plugins folder: the suite parses into
    its real DAG (not the invalid-suite DAG), beside the janitor and maintenance DAGs."""
    python, site = clean_venv
    env = _env(tmp_path, tmp_path / "empty-plugins")
    home = Path(env["AIRFLOW_HOME"])
    for name in ("accelmatrix_suites.py", "accelmatrix_janitor.py", "accelmatrix_maintenance.py"):
        shutil.copy(ROOT / "dags" / name, home / "dags" / name)
    include = home / "include"
    for part in ("workloads", "bounds"):
        shutil.copytree(ROOT / "include" / part, include / part)
    (include / "suites").mkdir()
    shutil.copy(ROOT / "include" / "suites" / "local_smoke.yaml", include / "suites")
    code = (
        "import json, sys, accelmatrix\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)\n"
        "print(json.dumps({'file': accelmatrix.__file__,\n"
        "  'dags': {i: sorted(t.task_id for t in d.tasks) for i, d in bag.dags.items()},\n"
        "  'errors': {str(k): str(v) for k, v in bag.import_errors.items()}}))\n"
    )
    started = time.monotonic()
    report = _report([python, "-c", code, home / "dags"], env)
    parse_s = time.monotonic() - started
    assert Path(report["file"]).is_relative_to(site)
    assert report["errors"] == {}, report["errors"]
    dags = report["dags"]
    assert sorted(dags) == ["accelmatrix_janitor", "accelmatrix_maintenance", "local_smoke"], dags
    tasks = dags["local_smoke"]
    assert {"plan", "gate"} <= set(tasks), tasks
    assert any(t.startswith("cpu-small.") for t in tasks), tasks
    # The suite was validated: its DAG-shape cache lies under $AIRFLOW_HOME/accelmatrix,
    # the installed package's default home (nothing written into the checkout).
    assert list((home / "accelmatrix" / "cache").rglob("*.json")), "no DAG shape cached"
    assert parse_s < 90, parse_s
