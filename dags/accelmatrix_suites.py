"""Every suite under include/suites/ becomes a DAG (one DAG per YAML file).

Thin on purpose: the converter lives in the accelmatrix package, and nothing heavy is
imported at parse time (see bench/bench_parse.py for the measured cost).
"""

from accelmatrix.dag_factory import build_dags

globals().update(build_dags())
