"""Hooks: thin, cached clients to the machines cells run on (credentials from Airflow)."""
