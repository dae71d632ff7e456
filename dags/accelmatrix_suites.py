"""Every suite file in the suites directory becomes an Airflow DAG (one DAG per YAML file).

The one file an existing Airflow deployment copies into its dags folder (docs/deploy.md,
"Adding accelmatrix to an existing Airflow deployment"): it needs the installed package
and nothing of this repository. The suites directory is ``$ACCELMATRIX_SUITES_DIR``, by
default ``$ACCELMATRIX_INCLUDE_DIR/suites``; the include directory (workloads, bounds) is
the checkout's include/ here and ``$AIRFLOW_HOME/include`` for an installed package
(accelmatrix/settings.py).

Thin on purpose: the converter lives in the accelmatrix package, and nothing heavy is
imported at parse time (bench/bench_parse.py measures the cost). The words "airflow" and
"dag" in this docstring also keep Airflow's safe-mode file heuristic from skipping it.
"""

from accelmatrix.dag_factory import build_dags

globals().update(build_dags())
