"""WorkloadTrigger: wait for a workload in the triggerer and stream its log live.

A 6-hour training run must not hold a worker slot, and on-call must see its log while it
runs: the trigger polls the backend (non-blocking calls, run in a thread), writes every new
log line through its logger (Airflow routes trigger logs into the task's log), and fires
once the workload exits or its deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class WorkloadTrigger(BaseTrigger):
    def __init__(
        self,
        machine_spec: dict[str, Any],
        handle: dict[str, Any],
        deadline: float,
        log_offset: int = 0,
        poll_interval: float = 1.0,
    ):
        super().__init__()
        self.machine_spec = machine_spec
        self.handle = handle
        self.deadline = deadline
        self.log_offset = log_offset
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "machine_spec": self.machine_spec,
                "handle": self.handle,
                "deadline": self.deadline,
                "log_offset": self.log_offset,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from accelmatrix.backends.base import get_backend

        backend = get_backend(self.machine_spec)
        offset = self.log_offset
        lines_seen = 0
        while True:
            lines, offset = await asyncio.to_thread(backend.read_logs, self.handle, offset)
            for line in lines:
                self.log.info("%s", line)
            lines_seen += len(lines)
            status = await asyncio.to_thread(backend.poll, self.handle)
            if status.done:
                # Drain what was written between the last read and the exit.
                lines, offset = await asyncio.to_thread(backend.read_logs, self.handle, offset)
                for line in lines:
                    self.log.info("%s", line)
                yield TriggerEvent(
                    {
                        "status": "infra_failed" if status.infrastructure_failure else "exited",
                        "exit_code": status.exit_code,
                        "detail": status.detail,
                        "log_offset": offset,
                    }
                )
                return
            if time.time() >= self.deadline:
                yield TriggerEvent(
                    {
                        "status": "timeout",
                        "exit_code": None,
                        "detail": "deadline passed",
                        "log_offset": offset,
                    }
                )
                return
            await asyncio.sleep(self.poll_interval)
