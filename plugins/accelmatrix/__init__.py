"""accelmatrix: test ML workloads across accelerator matrices on Apache Airflow 3.

Kept import-light on purpose: DAG files import ``accelmatrix.dag_factory`` at parse time,
so nothing heavy (pandas, Great Expectations, torch, SQLAlchemy) may be imported here.
"""

__version__ = "0.1.0"
