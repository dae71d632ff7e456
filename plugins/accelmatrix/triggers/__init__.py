"""Triggers: asynchronous waits that run in the Airflow triggerer."""
