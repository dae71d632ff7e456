"""Where the export writes and how long each kind of run is kept, from the deployment's
settings (environment variables, like ``accelmatrix.settings``: the CLI, the gate's export
task and the maintenance DAG all agree without Airflow's conf machinery).

ACCELMATRIX_WAREHOUSE_DATASET     PROJECT.DATASET (or DATASET with the connection's project);
                                  unset: no export (the default)
ACCELMATRIX_WAREHOUSE_CONN_ID     the Airflow Google connection (google_cloud_default)
ACCELMATRIX_WAREHOUSE_LOCATION    the dataset's location (US)
ACCELMATRIX_WAREHOUSE_ENDPOINT    an API endpoint other than Google's (a BigQuery emulator,
                                  a private endpoint): the client is pointed at it with
                                  ``client_options`` and sends no credentials
ACCELMATRIX_WAREHOUSE_DEADLINE_S  how long one export retries a failing call (120)
ACCELMATRIX_RETENTION             days to keep a run, by kind, e.g. ``default=365,pull_request=42``
                                  (Perfherder's 365 days for main, 42 for try); unset: runs
                                  are kept for good, in the store and in the warehouse
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import msgspec

__all__ = ["ConfigError", "Retention", "WarehouseConfig", "RUN_KINDS"]

# What a run is, for retention: a run started for a pull request, a follow-up (a re-test
# or a build comparison), or any other (scheduled, manual, backfill).
RUN_KINDS = ("default", "pull_request", "followup")
_NAME = re.compile(r"^[A-Za-z0-9_]{1,1024}$")
_PROJECT = re.compile(r"^[a-z][a-z0-9.:-]{0,62}$")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and what is allowed."""


class Retention(msgspec.Struct, frozen=True, kw_only=True):
    """Days to keep a run of each kind; a kind not named keeps ``default``'s days, and with
    no ``default`` it is kept for good. Empty (the setting unset): nothing is ever deleted."""

    days: dict[str, int]

    def for_kind(self, kind: str) -> int | None:
        return self.days.get(kind, self.days.get("default"))

    @property
    def longest(self) -> int | None:
        """The partition expiration of every table (no partition outlives every kind);
        None when some kind is kept for good."""
        kept = [self.for_kind(k) for k in RUN_KINDS]
        return None if None in kept else max(k for k in kept if k is not None)

    @classmethod
    def parse(cls, text: str | None, setting: str = "ACCELMATRIX_RETENTION") -> Retention:
        """``default=365,pull_request=42``: kinds from RUN_KINDS, whole days >= 1."""
        days: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            kind, sep, value = part.partition("=")
            kind = kind.strip()
            if not sep or kind not in RUN_KINDS:
                raise ConfigError(
                    f"{setting}: {part!r} is not KIND=DAYS with KIND one of {', '.join(RUN_KINDS)}"
                )
            try:
                n = int(value)
            except ValueError:
                n = 0
            if n < 1:
                raise ConfigError(
                    f"{setting}: {kind}={value.strip()!r}: days must be a whole number >= 1"
                )
            days[kind] = n
        return cls(days=days)


class WarehouseConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The export's target. ``project`` None: the connection's (or the client's) project."""

    dataset: str
    project: str | None = None
    conn_id: str = "google_cloud_default"
    location: str = "US"
    endpoint: str | None = None
    deadline_s: float = 120.0
    retention: Retention = msgspec.field(default_factory=lambda: Retention(days={}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WarehouseConfig | None:
        """The deployment's warehouse, or None when ACCELMATRIX_WAREHOUSE_DATASET is unset."""
        env = os.environ if env is None else env
        target = env.get("ACCELMATRIX_WAREHOUSE_DATASET", "").strip()
        if not target:
            return None
        project, _, dataset = target.rpartition(".")
        if not _NAME.match(dataset) or (project and not _PROJECT.match(project)):
            raise ConfigError(
                f"ACCELMATRIX_WAREHOUSE_DATASET={target!r}: expected PROJECT.DATASET or DATASET"
                " (dataset: letters, digits, underscores; project: a Google Cloud project id)"
            )
        deadline = env.get("ACCELMATRIX_WAREHOUSE_DEADLINE_S", "120")
        try:
            deadline_s = float(deadline)
        except ValueError:
            deadline_s = -1.0
        if not deadline_s > 0:
            raise ConfigError(
                f"ACCELMATRIX_WAREHOUSE_DEADLINE_S={deadline!r}: seconds, a number > 0"
            )
        endpoint = env.get("ACCELMATRIX_WAREHOUSE_ENDPOINT", "").strip() or None
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"ACCELMATRIX_WAREHOUSE_ENDPOINT={endpoint!r}: a URL starting with http:// or https://"
            )
        return cls(
            dataset=dataset,
            project=project or None,
            conn_id=env.get("ACCELMATRIX_WAREHOUSE_CONN_ID", "").strip() or "google_cloud_default",
            location=env.get("ACCELMATRIX_WAREHOUSE_LOCATION", "").strip() or "US",
            endpoint=endpoint,
            deadline_s=deadline_s,
            retention=Retention.parse(env.get("ACCELMATRIX_RETENTION")),
        )


def retention_from_env(env: Mapping[str, str] | None = None) -> Retention:
    """The store's retention (the same setting as the warehouse's, also without a warehouse)."""
    env = os.environ if env is None else env
    return Retention.parse(env.get("ACCELMATRIX_RETENTION"))


def export_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether suite DAGs get the export task: read while DAG files are parsed, so it only
    looks whether the dataset is named; the task itself validates every setting (a bad one
    fails the export task with the setting named, never the DAG file)."""
    env = os.environ if env is None else env
    return bool(env.get("ACCELMATRIX_WAREHOUSE_DATASET", "").strip())
