"""Every suite under include/suites/ becomes an Airflow DAG (one DAG per YAML file).

Thin on purpose: the converter lives in the accelmatrix package, and nothing heavy is
imported at parse time (bench/bench_parse.py measures the cost). The words "airflow" and
"dag" in this docstring also keep Airflow's safe-mode file heuristic from skipping it.
"""

from accelmatrix.dag_factory import build_dags

globals().update(build_dags())
