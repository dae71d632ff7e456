"""EXPERIMENT, not part of accelmatrix and never loaded by it: cache mapped-task-group lengths
for one scheduling pass of a dag run, in the scheduler process only.

Question it answers: how much of the scheduler's pass, and of a cell's held time, is Airflow
3.3.2's ``TriggerRuleDep`` asking ``TaskMap`` for the mapped group's length once per waiting
task instance and upstream (py-spy: 29 % of the scheduler's samples at 64 cells)? Within one
``DagRun.task_instance_scheduling_decisions`` call the length cannot change, so the cache
is keyed by (expand argument, run id) and dropped when the call returns.

    PYTHONPATH=bench/experiments/map_length_cache \
        .venv/bin/python bench/bench_lifecycle.py --sizes 64

AirflowStack appends PYTHONPATH to the components' path, so Python imports this file at
start-up in every component; it patches only when the process is ``airflow scheduler``,
and prints its hit/miss count to the scheduler's log at exit. Result: BENCHMARKS.md
(2026-11-27, second session).
"""

import contextvars
import importlib.abc
import sys

_CACHE = contextvars.ContextVar("map_len_cache", default=None)
_TARGETS = {"airflow.models.dagrun", "airflow.serialization.definitions.xcom_arg"}
HITS = [0, 0]


def _patch(name, module):
    if name == "airflow.serialization.definitions.xcom_arg":
        orig = module.get_task_map_length

        def cached(xcom_arg, run_id, *, session):
            cache = _CACHE.get()
            if cache is None:
                return orig(xcom_arg, run_id, session=session)
            key = (id(xcom_arg), run_id)
            if key in cache:
                HITS[0] += 1
                return cache[key]
            HITS[1] += 1
            value = cache[key] = orig(xcom_arg, run_id, session=session)
            return value

        module.get_task_map_length = cached
    elif name == "airflow.models.dagrun":
        cls = module.DagRun
        orig_dec = cls.task_instance_scheduling_decisions

        def decisions(self, *args, **kwargs):
            token = _CACHE.set({})
            try:
                return orig_dec(self, *args, **kwargs)
            finally:
                _CACHE.reset(token)

        cls.task_instance_scheduling_decisions = decisions


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _patch(fullname, module)

        loader.exec_module = exec_module
        return spec


if len(sys.argv) > 1 and sys.argv[1] == "scheduler":
    sys.meta_path.insert(0, _Finder())
    import atexit

    atexit.register(lambda: print(f"map-length cache hits/misses {HITS}", file=sys.stderr))
