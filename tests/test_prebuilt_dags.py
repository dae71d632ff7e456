"""DAGs prebuilt before a fork (dag_factory.prebuild_dags, called by accelmatrix.deploy.preload).

A forked task process takes its suite's DAG from the parent's memory instead of building it
again. What must hold: it is taken only in a forked process, only once there, only while
the suite file is unchanged (an edited suite is built afresh with the edit), and never in
the process that built it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import os, sys
from pathlib import Path
from accelmatrix import dag_factory

suites = Path(os.environ["ACCELMATRIX_SUITES_DIR"])
path = suites / "local_smoke.yaml"
assert dag_factory.prebuild_dags() == 2
prebuilt = dict(dag_factory._prebuilt)
(mine,) = [d for (p, _), d in prebuilt.items() if p == str(path)]

# The builder itself always builds afresh (nothing forked would see a change it makes).
assert dag_factory.build_dag(path) is not mine


def in_child(check):
    pid = os.fork()
    if pid == 0:
        try:
            check()
        except BaseException as e:  # report and fail the child
            print(f"child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, check.__name__


def taken_once():
    first = dag_factory.build_dag(path)
    assert first is mine, "a forked process builds the DAG again"
    second = dag_factory.build_dag(path)
    assert second is not mine and second.dag_id == mine.dag_id
    # The DAG file's own entry point hands it out too (one suite here: the parser's way).
    other = dag_factory.build_dags()
    assert set(other) == {"local_smoke", "tiered_ci"}


def edited_suite_is_built_afresh():
    path.write_text(path.read_text().replace("description: >-", "description: >-\\n  EDITED", 1))
    dag = dag_factory.build_dag(path)
    assert dag is not mine
    assert "EDITED" in dag.description, dag.description


def not_taken_with_use_cache_false():
    assert dag_factory.build_dag(path, use_cache=False) is not mine


in_child(taken_once)
in_child(not_taken_with_use_cache_false)
in_child(edited_suite_is_built_afresh)
print("ok")
"""


def test_prebuilt_dags_are_taken_once_in_a_fork_and_only_while_the_file_is_unchanged(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    for name in ("local_smoke.yaml", "tiered_ci.yaml"):
        shutil.copy(ROOT / "include" / "suites" / name, suites / name)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "plugins"),
        "ACCELMATRIX_SUITES_DIR": str(suites),
        "ACCELMATRIX_HOME": str(tmp_path / "home"),
    }
    out = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok"), out.stdout
