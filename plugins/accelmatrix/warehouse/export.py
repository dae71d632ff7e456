"""Runs of the results store -> the warehouse's tables, exactly once per run.

How one export writes (``Warehouse.write``):

1. the tables are created when missing (partitioned by ``run_date``, clustered, partition
   expiration = the longest retention), and a column a newer row record added is added;
2. the rows of every table go to one staging table of this export in ONE load job
   (newline-delimited JSON through a resumable upload; each row names its table), however
   many cells the runs have;
3. one multi-statement transaction deletes every row of the exported runs (per-run tables)
   and of their suites (suite tables) and inserts the staged rows, table by table; the
   staging table is dropped (it also expires after a day on its own).

A run exported twice, a retried gate, a re-run cell or a backfill over runs already there
therefore leaves one copy of each row: the transaction replaces, never appends. A failure
before COMMIT (an outage, a killed worker) changes nothing, so the whole export can simply
be done again, which is what the retry does: the export as a unit, with exponential
backoff, until ``deadline_s``. Then ``export_after_gate`` logs, once, the command that
exports the run again, and the run's verdict stands (the export task comes after the gate).
"""

from __future__ import annotations

import io
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from accelmatrix.results.runs import is_followup
from accelmatrix.warehouse.config import WarehouseConfig
from accelmatrix.warehouse.rows import (
    TABLE_TAG,
    TABLES,
    TableSpec,
    bigquery_fields,
    cell_rows,
    change_point_rows,
    check_rows,
    metric_rows,
    retest_rows,
    run_date,
    run_row,
    staging_fields,
)
from accelmatrix.warehouse.views import create_views

if TYPE_CHECKING:  # pragma: no cover
    from google.cloud import bigquery

    from accelmatrix.contracts.run_records import RunRecord
    from accelmatrix.results.store import ResultsStore

__all__ = [
    "ExportBatch",
    "ExportResult",
    "Warehouse",
    "collect",
    "export_after_gate",
    "export_runs",
    "finished_runs_since",
    "reexport_command",
    "run_kind",
]

log = logging.getLogger("accelmatrix.warehouse")
SCHEMA_VERSION = "1"  # the tables' label; bump with a change to a row record
STAGING_HOURS = 24


class ExportBatch(msgspec.Struct, kw_only=True):
    """The rows of one export, by table name, and which runs and suites they replace."""

    runs: list[tuple[str, str]]
    suites: list[str]
    rows: dict[str, list[msgspec.Struct]]


class ExportResult(msgspec.Struct, frozen=True, kw_only=True):
    runs: int
    rows: dict[str, int]
    load_jobs: int
    tries: int
    seconds: float


def run_kind(store: ResultsStore, run: RunRecord) -> str:
    """default, pull_request or followup: which retention a run's rows get."""
    if is_followup(run):
        return "followup"
    if store.pull_request_run(run.dag_id, run.run_id) is not None:
        return "pull_request"
    return "default"


def collect(
    store: ResultsStore, keys: Iterable[tuple[str, str]], exported_at: datetime | None = None
) -> ExportBatch:
    """The rows of the runs ``keys`` ((dag_id, run_id)) and of their suites, as the store
    holds them now. A key the store does not know is an error naming it."""
    exported_at = exported_at or datetime.now(UTC)
    rows: dict[str, list[msgspec.Struct]] = {t.name: [] for t in TABLES}
    done: list[tuple[str, str]] = []
    kinds: dict[str, dict[str, str]] = defaultdict(dict)
    for dag_id, run_id in dict.fromkeys(keys):
        run = store.get_run(dag_id, run_id)
        if run is None:
            raise LookupError(f"no run {run_id!r} of {dag_id!r} in the results store")
        kind = run_kind(store, run)
        kinds[dag_id][run_id] = kind
        cells = store.get_cells(dag_id, run_id)
        rows["runs"].append(run_row(run, cells, kind, exported_at))
        rows["cells"] += cell_rows(run, cells, kind)
        rows["metric_points"] += metric_rows(run, store.get_metrics(dag_id, run_id), kind)
        rows["check_verdicts"] += check_rows(run, store.get_checks(dag_id, run_id), kind)
        done.append((dag_id, run_id))
    suites = sorted({d for d, _ in done})
    for dag_id in suites:
        points = store.get_change_points(dag_id)
        known = kinds[dag_id]
        for p in points:
            if p.run_id not in known and (r := store.get_run(dag_id, p.run_id)) is not None:
                known[p.run_id] = run_kind(store, r)
        rows["change_points"] += change_point_rows(points, known)
        retests = store.get_confirmations(dag_id)
        groups = {
            g.id: g for g in store.get_change_groups(dag_id, ids={r.group_id for r in retests})
        }
        rows["retest_verdicts"] += retest_rows(retests, groups)
    return ExportBatch(runs=done, suites=suites, rows=rows)


def finished_runs_since(
    store: ResultsStore, since: date, dag_id: str | None = None
) -> list[tuple[str, str]]:
    """Every run the gate decided (passed or failed) whose run date is ``since`` or later."""
    out = []
    for suite in [dag_id] if dag_id else store.suite_dag_ids():
        for run in store.get_runs(suite):
            if run.state in ("passed", "failed") and run_date(run) >= since:
                out.append((run.dag_id, run.run_id))
    return sorted(out)


def reexport_command(dag_id: str, run_id: str) -> str:
    import shlex

    return shlex.join(
        ["python", "-m", "accelmatrix", "export", "--dag-id", dag_id, "--run-id", run_id]
    )


def _transient(exc: BaseException) -> bool:
    """Worth another try: the service or the network, not our request (4xx is ours)."""
    import requests
    from google.api_core import exceptions as api

    try:
        from google.resumable_media import common as media
    except ImportError:  # pragma: no cover - always there with google-cloud-bigquery
        media = None
    if isinstance(exc, api.BadRequest) and "concurrent update" in str(exc):
        # Two exports of one suite at once (two runs' gates): BigQuery aborts one
        # transaction ("Could not serialize access to table ... due to concurrent update");
        # it goes through on the next try.
        return True
    if isinstance(exc, api.ClientError) and not isinstance(exc, api.TooManyRequests):
        return False
    transient: tuple[type[BaseException], ...] = (
        ConnectionError,
        TimeoutError,
        requests.exceptions.RequestException,
        api.ServerError,
        api.TooManyRequests,
        api.RetryError,
    )
    if media is not None:
        transient += (media.InvalidResponse, media.DataCorruption)
    return isinstance(exc, transient)


class Warehouse:
    """One dataset of BigQuery, through the google-cloud-bigquery client.

    The client comes from the Google provider's ``BigQueryHook`` (credentials and project
    from the Airflow connection ``conn_id``), or, with ``endpoint`` set (an emulator),
    from the client itself pointed at it with ``client_options`` and no credentials.
    """

    def __init__(self, config: WarehouseConfig, client: bigquery.Client | None = None):
        self.config = config
        self._client = client
        self._ready = False

    @property
    def client(self) -> bigquery.Client:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self) -> bigquery.Client:
        from google.cloud import bigquery

        cfg = self.config
        if cfg.endpoint:
            from google.auth.credentials import AnonymousCredentials

            return bigquery.Client(
                project=cfg.project or "accelmatrix",
                location=cfg.location,
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": cfg.endpoint},
            )
        from airflow.providers.google.cloud.hooks.bigquery import BigQueryHook

        hook = BigQueryHook(gcp_conn_id=cfg.conn_id, location=cfg.location)
        return hook.get_client(project_id=cfg.project or hook.project_id, location=cfg.location)

    @property
    def dataset_id(self) -> str:
        return f"{self.client.project}.{self.config.dataset}"

    def table_id(self, name: str) -> str:
        return f"{self.dataset_id}.{name}"

    def _api_retry(self) -> Any:
        from google.cloud.bigquery import DEFAULT_RETRY

        return DEFAULT_RETRY.with_deadline(min(30.0, self.config.deadline_s))

    # -- tables ------------------------------------------------------------------------
    def schema(self, spec: TableSpec) -> list[bigquery.SchemaField]:
        from google.cloud import bigquery

        return [
            bigquery.SchemaField(name, kind, mode=mode, description=text)
            for name, kind, mode, text in bigquery_fields(spec.row)
        ]

    def ensure_tables(self) -> None:
        """Create the dataset and the tables when missing; add columns a table lacks;
        keep each table's partition expiration at the longest retention (none when some
        kind of run is kept for good); (re)create the
        views of include/sql/cell_nights.sql."""
        from google.api_core.exceptions import NotFound
        from google.cloud import bigquery

        client, retry = self.client, self._api_retry()
        ds = bigquery.Dataset(self.dataset_id)
        ds.location = self.config.location
        client.create_dataset(ds, exists_ok=True, retry=retry)
        longest = self.config.retention.longest
        expiration_ms = longest * 86_400_000 if longest is not None else None
        for spec in TABLES:
            schema = self.schema(spec)
            try:
                table = client.get_table(self.table_id(spec.name), retry=retry)
            except NotFound:
                table = bigquery.Table(self.table_id(spec.name), schema=schema)
                table.time_partitioning = bigquery.TimePartitioning(
                    type_=bigquery.TimePartitioningType.DAY,
                    field="run_date",
                    expiration_ms=expiration_ms,
                )
                table.clustering_fields = list(spec.clustering)
                table.description = spec.description
                table.labels = {"accelmatrix_schema": SCHEMA_VERSION}
                client.create_table(table, exists_ok=True, retry=retry)
                continue
            fields: list[str] = []
            have = {f.name for f in table.schema}
            if missing := [f for f in schema if f.name not in have]:
                # BigQuery adds NULLABLE columns only; a REQUIRED one is relaxed for old rows.
                table.schema = [
                    *table.schema,
                    *(bigquery.SchemaField(f.name, f.field_type, mode="NULLABLE",
                                           description=f.description) for f in missing),
                ]  # fmt: skip
                fields.append("schema")
            tp = table.time_partitioning
            if tp is not None and tp.expiration_ms != expiration_ms:
                tp.expiration_ms = expiration_ms
                table.time_partitioning = tp
                fields.append("time_partitioning")
            if fields:
                client.update_table(table, fields, retry=retry)
        create_views(client, self.dataset_id)
        self._ready = True

    # -- writing -----------------------------------------------------------------------
    def write(
        self, batch: ExportBatch, sleep: Callable[[float], None] = time.sleep
    ) -> ExportResult:
        """Replace the batch's runs and suites in the warehouse; retried as a whole (it is
        idempotent) with exponential backoff while errors are transient, until the
        deadline. Raises the last error then."""
        t0 = time.monotonic()
        delay, tries = 1.0, 0
        while True:
            tries += 1
            try:
                jobs = self._write_once(batch)
                break
            except Exception as e:  # noqa: BLE001 - sorted by _transient below
                left = self.config.deadline_s - (time.monotonic() - t0)
                if not _transient(e) or left <= 0:
                    raise
                log.warning(
                    "warehouse: try %d failed (%s: %s); again in %.0f s",
                    tries, type(e).__name__, e, min(delay, left),
                )  # fmt: skip
                sleep(min(delay, left))
                delay = min(delay * 2, 30.0)
        return ExportResult(
            runs=len(batch.runs),
            rows={k: len(v) for k, v in batch.rows.items()},
            load_jobs=jobs,
            tries=tries,
            seconds=time.monotonic() - t0,
        )

    def _write_once(self, batch: ExportBatch) -> int:
        """One try: every row into one staging table in ONE load job, then the replacing
        transaction. Returns the load jobs run (0 or 1)."""
        from google.cloud import bigquery

        if not batch.runs:
            return 0
        if not self._ready:
            self.ensure_tables()
        client, retry = self.client, self._api_retry()
        rows = [r for spec in TABLES for r in batch.rows.get(spec.name) or ()]
        staged: set[str] = {spec.name for spec in TABLES if batch.rows.get(spec.name)}
        stage = self.table_id(f"_stage_{datetime.now(UTC):%Y%m%d%H%M%S}_{secrets.token_hex(4)}")
        schema = [
            bigquery.SchemaField(n, kind, mode=mode, description=text)
            for n, kind, mode, text in staging_fields()
        ]
        table = bigquery.Table(stage, schema=schema)
        table.expires = datetime.now(UTC) + timedelta(hours=STAGING_HOURS)
        client.create_table(table, retry=retry)
        try:
            # A resumable upload (size=None): the client's multipart upload labels the data
            # */*, which some endpoints (the emulator) refuse; either way it is one job.
            data = io.BytesIO(msgspec.json.Encoder().encode_lines(rows))
            job = client.load_table_from_file(
                data,
                stage,
                size=None,
                num_retries=2,
                job_config=bigquery.LoadJobConfig(
                    schema=schema,
                    source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
                    write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
                ),
            )
            job.result(retry=retry, timeout=self.config.deadline_s)
            if job.output_rows != len(rows):
                raise RuntimeError(
                    f"warehouse: load job {job.job_id} wrote {job.output_rows} rows, "
                    f"{len(rows)} were sent"
                )
            script = self._replace_script(batch, stage, staged)
            client.query(script, retry=retry, job_retry=None).result(
                retry=retry, timeout=self.config.deadline_s
            )
        finally:
            try:
                client.delete_table(stage, not_found_ok=True, retry=None, timeout=10)
            except Exception:  # noqa: BLE001 - it expires on its own
                log.debug("staging table %s left to expire", stage)
        return 1

    def _replace_script(self, batch: ExportBatch, stage: str, staged: set[str]) -> str:
        """One transaction: the exported runs' and suites' rows out, the staged rows in.

        The runs and suites are given as quoted string literals: BigQuery takes arrays of
        structs as query parameters, but bqemulator 1.4.0 does not pass them into a
        script ("Values were not provided"), and the tests run against it."""

        def lit(s: str) -> str:
            return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"

        # Each element typed in full: no reliance on coercing untyped tuples in an array.
        runs = ", ".join(
            f"STRUCT<suite STRING, run_id STRING>({lit(d)}, {lit(r)})" for d, r in batch.runs
        )
        suites = ", ".join(lit(s) for s in batch.suites)
        out = ["BEGIN TRANSACTION;"]
        for spec in TABLES:
            target = f"`{self.table_id(spec.name)}`"
            if spec.key == "run":
                out.append(
                    f"DELETE FROM {target} AS t WHERE EXISTS (SELECT 1 FROM UNNEST("
                    f"[{runs}]) AS k "
                    "WHERE k.suite = t.suite AND k.run_id = t.run_id);"
                )
            else:
                out.append(f"DELETE FROM {target} AS t WHERE t.suite IN ({suites});")
            if spec.name in staged:
                cols = ", ".join(name for name, *_ in bigquery_fields(spec.row))
                out.append(
                    f"INSERT INTO {target} ({cols}) SELECT {cols} FROM `{stage}` "
                    f"WHERE {TABLE_TAG} = {lit(spec.name)};"
                )
        out.append("COMMIT TRANSACTION;")
        return "\n".join(out)

    def count(self, table: str, where: str = "TRUE") -> int:
        """Rows of one table (tests, the CLI's summary)."""
        job = self.client.query(f"SELECT COUNT(*) AS n FROM `{self.table_id(table)}` WHERE {where}")
        return int(next(iter(job.result())).n)


def export_runs(
    store: ResultsStore,
    keys: Sequence[tuple[str, str]],
    config: WarehouseConfig,
    *,
    warehouse: Warehouse | None = None,
) -> ExportResult:
    """Export the runs ``keys`` (and their suites' change points and re-tests)."""
    wh = warehouse or Warehouse(config)
    return wh.write(collect(store, keys))


def export_after_gate(
    store: ResultsStore,
    dag_id: str,
    run_id: str,
    config: WarehouseConfig,
    *,
    warehouse: Warehouse | None = None,
) -> ExportResult | None:
    """The export task's work: the run's rows to the warehouse. On failure (after the
    retries) one error line with the command that exports the run again; returns None.
    Never raises: the caller decides how the task ends."""
    try:
        result = export_runs(store, [(dag_id, run_id)], config, warehouse=warehouse)
    except Exception as e:  # noqa: BLE001 - the verdict stands whatever the warehouse does
        log.error(
            "warehouse export of %s %s failed (%s: %s); the run's verdict stands. "
            "Export it again with: %s",
            dag_id, run_id, type(e).__name__, e, reexport_command(dag_id, run_id),
        )  # fmt: skip
        return None
    log.info(
        "warehouse: %s %s exported to %s in %.2f s (%d load job(s), try %d): %s",
        dag_id, run_id, config.dataset, result.seconds, result.load_jobs, result.tries,
        ", ".join(f"{k} {v}" for k, v in result.rows.items()),
    )  # fmt: skip
    return result
