"""Background jobs (imports): one at a time, progress visible at ``GET /v1/jobs/{id}``."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from hps.errors import HPSError, UnknownTableError
from hps.types import JSON

log = logging.getLogger(__name__)

State = Literal["queued", "running", "done", "failed"]
KEEP_JOBS = 100


@dataclass
class Job:
    """One job; ``advance`` is called by the worker as rows are written."""

    kind: str
    target: str
    rows_total: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    state: State = "queued"
    rows_done: int = 0
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    result: JSON = field(default_factory=dict)

    def advance(self, rows: int) -> None:
        self.rows_done += rows

    def view(self) -> JSON:
        end = self.finished or time.time()
        elapsed = (end - self.started) if self.started else 0.0
        return {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "state": self.state,
            "rows_total": self.rows_total,
            "rows_done": self.rows_done,
            "rows_per_s": round(self.rows_done / elapsed, 1) if elapsed > 0 else 0.0,
            "elapsed_s": round(elapsed, 3),
            "error": self.error,
            "result": self.result,
        }


class JobRegistry:
    """Runs jobs on one worker thread (imports of one node are serialised) and keeps them."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-admin-job")

    def submit(self, job: Job, work: Callable[[Job], JSON]) -> Job:
        with self._lock:
            self._jobs[job.id] = job
            for old in list(self._jobs)[:-KEEP_JOBS]:
                if self._jobs[old].state in ("done", "failed"):
                    del self._jobs[old]
        self._pool.submit(self._run, job, work)
        return job

    def _run(self, job: Job, work: Callable[[Job], JSON]) -> None:
        job.state, job.started = "running", time.time()
        try:
            job.result = work(job)
            job.state = "done"
        except HPSError as exc:
            job.error, job.state = str(exc), "failed"
        except Exception as exc:  # a job must end in a state, whatever happened
            log.exception("job %s failed", job.id)
            job.error, job.state = f"{type(exc).__name__}: {exc}", "failed"
        finally:
            job.finished = time.time()

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise UnknownTableError(f"no job {job_id!r}")
        return job

    def close(self) -> None:
        self._pool.shutdown(wait=True)
