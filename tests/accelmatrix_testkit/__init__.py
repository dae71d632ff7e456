"""Test helpers that need more than pytest: a real Airflow stack in a temporary AIRFLOW_HOME.

Nothing here is imported by DAG files or tasks.
"""

from accelmatrix_testkit.airflow_stack import AirflowStack, StackError, Usage, by_step_and_cell

__all__ = ["AirflowStack", "StackError", "Usage", "by_step_and_cell"]
