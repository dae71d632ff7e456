"""Notifications: who hears about a run or a cell, once, and how it reaches them.

dedup.py: one alert per (suite, cell), its recurrences counted, and the delivery of
change groups (one per cause); transport.py: what each message says (run webhook payload,
Slack blocks, GitHub issue fields) and sending it; notifiers.py: the Airflow notifiers
that carry it (HttpHook with retries, GitHub issues). The suite's ``notify`` settings are
parsed in accelmatrix.spec.notify (imported at DAG parse time, so kept light); the alert
rows live in the results store (results/series_status.py).
"""
