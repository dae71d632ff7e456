-- Run once by the postgres image, on an empty data volume, after it has created the
-- `airflow` role and the `airflow` metadata database (POSTGRES_USER / POSTGRES_DB).
-- accelmatrix keeps its results in a database of its own (ACCELMATRIX_RESULTS_URL), so
-- `airflow db reset` or a metadata migration never touches them.
CREATE DATABASE accelmatrix OWNER airflow;
