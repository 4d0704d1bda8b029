"""A job and its record in the state dir: persistence, recovery at start, stale uploads.

- **Recorded.** Every job is a JSON record ``<id>.json`` in the records folder (the control
  plane's ``jobs/``), rewritten whole (a temporary file, then a rename) at each change of
  state; a record that cannot be written is logged, never fails the job. Staged uploads
  live in their own folder (``uploads/``); a job's is removed when it ends, whatever the end.
- **Recovered.** At start (:meth:`JobRecords.recover`) unreadable records are removed; a job
  found ``running`` (the process died under it) is marked ``interrupted`` with the reason; a
  queued one is resumed when its kind has a resumer (imports do: the record names the
  model, table, format and folder), else marked ``interrupted``. Staged uploads no resumed
  job names are removed then.

The queue that runs jobs, its bounds and its shutdown are :mod:`hps.service.jobs`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from hps.types import JSON

log = logging.getLogger(__name__)

State = Literal["queued", "running", "done", "failed", "interrupted"]

Work = Callable[["Job"], JSON]
Resumer = Callable[["Job"], Work]  # a recorded job -> its work again (raises if it cannot)


class JobInterrupted(Exception):
    """Raised by :meth:`Job.advance` once the control plane is stopping."""


class JobRecord(TypedDict):
    """A job as its JSON record in the state dir holds it."""

    kind: str
    target: str
    rows_total: int
    id: str
    state: State
    rows_done: int
    started: float | None
    finished: float | None
    error: str | None
    result: JSON
    params: dict[str, str]
    staged: str | None
    staged_bytes: int
    created: float


@dataclass
class Job:
    """One job; ``advance`` is called by the worker as rows are written.

    ``params`` say how to run the job again after a restart (its kind's resumer reads
    them); ``staged`` is the folder of its uploaded files, removed when the job ends.
    """

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
    params: dict[str, str] = field(default_factory=dict)
    staged: str | None = None
    staged_bytes: int = 0
    created: float = field(default_factory=time.time)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def advance(self, rows: int) -> None:
        self.rows_done += rows
        if self._stop.is_set():
            raise JobInterrupted

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

    def record(self) -> JobRecord:
        """What is kept on disk: everything but the stop flag."""
        return {
            "kind": self.kind,
            "target": self.target,
            "rows_total": self.rows_total,
            "id": self.id,
            "state": self.state,
            "rows_done": self.rows_done,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
            "result": self.result,
            "params": self.params,
            "staged": self.staged,
            "staged_bytes": self.staged_bytes,
            "created": self.created,
        }

    @classmethod
    def from_record(cls, rec: JobRecord) -> Job:
        return cls(**rec)

    def remove_staged(self) -> None:
        if self.staged:
            shutil.rmtree(self.staged, ignore_errors=True)


_RECORD = TypeAdapter(JobRecord)


@dataclass
class Recovered:
    """What :meth:`JobRecords.recover` found: every recorded job, oldest first, each with
    its work again if it is resumed (None if not), and what was done, counted."""

    jobs: list[tuple[Job, Work | None]]
    counts: dict[str, int]


class JobRecords:
    """The job records of one registry (``folder``) and its staged uploads (``staging``)."""

    def __init__(self, folder: Path, staging: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        staging.mkdir(parents=True, exist_ok=True)
        self.folder, self.staging = folder, staging

    def save(self, job: Job) -> None:
        path = self.folder / f"{job.id}.json"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(job.record()))
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:  # a full disk must not fail the job
            log.warning("cannot record job %s in %s: %s", job.id, self.folder, exc)

    def forget(self, job_id: str) -> None:
        with contextlib.suppress(OSError):
            (self.folder / f"{job_id}.json").unlink()

    def recover(self, resumers: Mapping[str, Resumer]) -> Recovered:
        """Read the records of a previous run: resume queued jobs (``resumers`` by kind),
        mark running ones ``interrupted``, remove staged uploads no resumed job uses."""
        records: list[Job] = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                records.append(Job.from_record(_RECORD.validate_json(path.read_bytes())))
            except (OSError, ValidationError) as exc:
                log.warning("unreadable job record %s removed: %s", path.name, exc)
                path.unlink(missing_ok=True)
        for tmp in self.folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        counts = {"resumed": 0, "interrupted": 0, "kept": 0}
        keep_staged: set[str] = set()
        jobs: list[tuple[Job, Work | None]] = []
        for job in sorted(records, key=lambda j: j.created):
            work: Work | None = None
            if job.state == "running":
                self._interrupt(
                    job,
                    f"the control plane stopped while this job ran ({job.rows_done} of "
                    f"{job.rows_total} rows written); submit it again (imports are upserts)",
                )
                counts["interrupted"] += 1
            elif job.state == "queued":
                work = self._resume(job, resumers.get(job.kind))
                if work is None:
                    counts["interrupted"] += 1
                else:
                    if job.staged:
                        keep_staged.add(str(Path(job.staged).resolve()))
                    counts["resumed"] += 1
            else:
                counts["kept"] += 1
            jobs.append((job, work))
        for stale in self.staging.iterdir():
            if str(stale.resolve()) not in keep_staged:
                log.info("removing stale staged upload %s", stale)
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        if counts["resumed"] or counts["interrupted"]:
            log.info(
                "jobs of the previous run: %d resumed, %d marked interrupted",
                counts["resumed"],
                counts["interrupted"],
            )
        return Recovered(jobs, counts)

    def _resume(self, job: Job, resumer: Resumer | None) -> Work | None:
        if resumer is None:
            self._interrupt(job, "the control plane restarted before this job ran; submit it again")
            return None
        try:
            return resumer(job)
        except Exception as exc:
            self._interrupt(job, f"the control plane restarted and cannot resume this job: {exc}")
            return None

    def _interrupt(self, job: Job, reason: str) -> None:
        job.state, job.error = "interrupted", reason
        job.finished = job.finished or time.time()
        job.remove_staged()
        self.save(job)
