"""The results in the team's warehouse (BigQuery): every finished run's cells, metric points,
check verdicts, change points and re-test verdicts as rows of partitioned tables.

rows.py      the rows of each table as typed records, built from the results store's records;
             the BigQuery schema is derived from them (one source for both)
config.py    where to write (dataset, connection, endpoint) and how long to keep what
export.py    one load job per table into staging tables, then one transaction that replaces
             the exported runs' rows: exactly once per run, whatever is re-exported
retention.py the same retention applied to the results store and to the warehouse

Nothing here is imported while a DAG file is parsed: the google-cloud-bigquery client is
imported inside the functions that talk to BigQuery.
"""
