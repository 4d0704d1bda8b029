"""Background jobs (imports): one at a time, bounded, recorded, progress at ``GET /v1/jobs/{id}``.

- **Bounded.** At most ``max_jobs`` jobs are pending (queued or running) and their staged
  uploads hold at most ``max_staged_bytes``; past either, a new one is refused with
  :class:`hps.errors.QueueFullError` (429 with ``Retry-After``). An upload is admitted
  *before* its body is read (:meth:`JobRegistry.reserve`, taken by the request middleware
  with the request's ``Content-Length``): a refused upload is never spooled. A chunked
  upload (no ``Content-Length``) reserves 0 and grows its reservation as its bytes arrive
  (:meth:`JobRegistry.grow`), refused once they pass the budget. The job submitted by that
  request takes the reservation over (a context variable carries it).
- **Recorded.** With a folder (:meth:`JobRegistry.attach`, the control plane's state dir)
  every job is a JSON record there and staged uploads live in the state dir too; at start
  (:meth:`JobRegistry.recover`) queued jobs are resumed or marked ``interrupted``, running
  ones marked ``interrupted``, stale uploads removed (:mod:`hps.service.job_records`).
- **Ended cleanly.** A job's staged folder is removed when it ends, whatever the end. On
  shutdown (:meth:`JobRegistry.close`) queued jobs stay queued on disk (resumed at the next
  start) and the running one stops at its next chunk (``advance`` raises
  :class:`~hps.service.job_records.JobInterrupted`): it is recorded ``interrupted``, naming
  the rows written.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hps.errors import BackendUnavailable, HPSError, QueueFullError, UnknownJobError
from hps.redact import scrub
from hps.service.job_records import Job, JobInterrupted, JobRecords, Resumer, State, Work
from hps.types import JSON

log = logging.getLogger(__name__)

PENDING: tuple[State, ...] = ("queued", "running")
KEEP_JOBS = 100
MAX_JOBS = 16
MAX_STAGED_BYTES = 64 * 1024**3
CLOSE_WAIT_S = 20.0  # how long shutdown waits for the running job to reach a chunk boundary
RETRY_AFTER_DEFAULT_S = 30
RETRY_AFTER_MAX_S = 3600


@dataclass
class Reservation:
    """A place in the queue held for a request whose job is not submitted yet."""

    registry: JobRegistry
    nbytes: int
    taken: bool = False  # by a job (submitted) or released

    def release(self) -> None:
        with self.registry._lock:
            if not self.taken:
                self.taken = True
                self.registry._reserved.discard(self)

    def __hash__(self) -> int:
        return id(self)


_current: contextvars.ContextVar[Reservation | None] = contextvars.ContextVar(
    "hps_job_reservation", default=None
)


class JobRegistry:
    """Runs jobs on one worker thread (imports of one node are serialised) and keeps them."""

    def __init__(self, max_jobs: int = MAX_JOBS, max_staged_bytes: int = MAX_STAGED_BYTES) -> None:
        self.max_jobs = max_jobs
        self.max_staged_bytes = max_staged_bytes
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-admin-job")
        self._futures: dict[str, Future[None]] = {}
        self._work: dict[str, Work] = {}  # of queued jobs: run again if reopened
        self._reserved: set[Reservation] = set()
        self._resumers: dict[str, Resumer] = {}
        self._durations: list[float] = []  # of the last finished jobs: Retry-After's estimate
        self._closing = False
        self._records: JobRecords | None = None

    # -- records (hps.service.job_records) -------------------------------------------------

    def attach(self, folder: Path, staging: Path) -> None:
        """Keep job records in ``folder``; staged uploads live under ``staging``."""
        self._records = JobRecords(folder, staging)

    @property
    def folder(self) -> Path | None:
        """The records' folder; None until :meth:`attach`."""
        return self._records.folder if self._records is not None else None

    def resumable(self, kind: str, resumer: Resumer) -> None:
        """Jobs of ``kind`` found queued at start are run again with ``resumer(job)``."""
        self._resumers[kind] = resumer

    def _save(self, job: Job) -> None:
        if self._records is not None:
            self._records.save(job)

    def _forget(self, job_id: str) -> None:
        if self._records is not None:
            self._records.forget(job_id)

    def recover(self) -> JSON:
        """Read the records of a previous run: resume queued jobs, mark running ones
        ``interrupted``, remove staged folders no resumed job uses. What was done, counted."""
        if self._records is None:
            return {}
        recovered = self._records.recover(self._resumers)
        for job, work in recovered.jobs:
            with self._lock:
                self._jobs[job.id] = job
            if work is not None:
                self._enqueue(job, work)
        self._prune()
        return {k: v for k, v in recovered.counts.items()}

    # -- admission -------------------------------------------------------------------------

    def _pending(self) -> tuple[int, int]:
        """(jobs or reservations pending, their staged bytes); under the lock."""
        jobs = [j for j in self._jobs.values() if j.state in PENDING]
        count = len(jobs) + len(self._reserved)
        nbytes = sum(j.staged_bytes for j in jobs) + sum(r.nbytes for r in self._reserved)
        return count, nbytes

    def _admit(self, nbytes: int) -> None:
        """Raise QueueFullError unless one more job of ``nbytes`` fits; under the lock."""
        if self._closing:
            raise BackendUnavailable("the control plane is shutting down; retry on its restart")
        count, staged = self._pending()
        if nbytes > self.max_staged_bytes:
            raise QueueFullError(
                f"{nbytes} bytes to stage exceed the limit of {self.max_staged_bytes} bytes",
                self._retry_after(count),
            )
        if count >= self.max_jobs:
            raise QueueFullError(
                f"{count} jobs are pending (the limit is {self.max_jobs}); retry later",
                self._retry_after(count),
            )
        if count and staged + nbytes > self.max_staged_bytes:
            raise QueueFullError(
                f"pending jobs stage {staged} bytes; {nbytes} more would pass the limit of "
                f"{self.max_staged_bytes}; retry later",
                self._retry_after(count),
            )

    def _admit_or_drop(self, job: Job) -> None:
        """:meth:`_admit` ``job``'s staged bytes, or remove its staged folder and raise."""
        try:
            self._admit(job.staged_bytes)
        except HPSError:
            job.remove_staged()
            raise

    def _retry_after(self, pending: int) -> int:
        """Seconds until a place is likely free: the recent mean job time (a default before
        any), times the jobs ahead that must end first."""
        if not self._durations:
            return RETRY_AFTER_DEFAULT_S
        mean = sum(self._durations) / len(self._durations)
        ahead = max(1, pending - self.max_jobs + 1)
        return int(min(RETRY_AFTER_MAX_S, max(1, math.ceil(mean * ahead))))

    def reserve(self, nbytes: int) -> Reservation:
        """Hold a place for a job of ``nbytes`` staged bytes (QueueFullError if none is
        free); :meth:`submit` in the same context takes it over, else ``release`` it."""
        with self._lock:
            self._admit(nbytes)
            res = Reservation(self, nbytes)
            self._reserved.add(res)
        return res

    def grow(self, res: Reservation, nbytes: int) -> None:
        """Raise ``res`` to ``nbytes`` (what a chunked upload has sent so far); QueueFullError
        if the staged bytes pending would pass the limit, ``res`` then released."""
        with self._lock:
            if res.taken or nbytes <= res.nbytes:
                return
            count, staged = self._pending()
            others = staged - res.nbytes
            if others + nbytes > self.max_staged_bytes:
                # refused: its bytes leave the budget now, not once its 429 has gone out (two
                # uploads growing together would refuse each other)
                res.taken = True
                self._reserved.discard(res)
                raise QueueFullError(
                    f"pending jobs stage {others} bytes; this upload's {nbytes} bytes so far "
                    f"pass the limit of {self.max_staged_bytes}; retry later",
                    self._retry_after(count),
                )
            res.nbytes = nbytes

    @contextlib.contextmanager
    def holding(self, res: Reservation) -> Iterator[Reservation]:
        """Make ``res`` the reservation a :meth:`submit` in this context takes over; released
        on exit if none did."""
        token = _current.set(res)
        try:
            yield res
        finally:
            _current.reset(token)
            res.release()

    @contextlib.contextmanager
    def reserved(self, nbytes: int) -> Iterator[Reservation]:
        """:meth:`reserve` then :meth:`holding`."""
        with self.holding(self.reserve(nbytes)) as res:
            yield res

    # -- running ---------------------------------------------------------------------------

    def submit(self, job: Job, work: Work) -> Job:
        """Queue ``job``. Admitted under the request's reservation if there is one, else
        now (QueueFullError past a limit: the job's staged folder is then removed)."""
        res = _current.get()
        with self._lock:
            if job.staged and not job.staged_bytes:
                job.staged_bytes = _size(Path(job.staged))  # what it holds, not what it said
            if res is not None and not res.taken and res.registry is self:
                res.taken = True
                self._reserved.discard(res)
                if job.staged_bytes > res.nbytes:  # a chunked upload reserved what it knew: 0
                    self._admit_or_drop(job)
                job.staged_bytes = job.staged_bytes or res.nbytes
            else:
                self._admit_or_drop(job)
            self._jobs[job.id] = job
        self._save(job)
        self._prune()
        self._enqueue(job, work)
        return job

    def _enqueue(self, job: Job, work: Work) -> None:
        with self._lock:
            self._work[job.id] = work
            self._futures[job.id] = self._pool.submit(self._run, job, work)

    def reopen(self) -> None:
        """Run again after :meth:`close` (an application started anew in one process):
        the jobs close left queued are queued again."""
        with self._lock:
            if not self._closing:
                return
            self._closing = False
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-admin-job")
            queued = [(j, self._work[i]) for i, j in self._jobs.items() if j.state == "queued"]
        for job, work in queued:
            self._enqueue(job, work)

    def _prune(self) -> None:
        with self._lock:
            ended = [i for i, j in self._jobs.items() if j.state not in PENDING]
            dropped = ended[: max(0, len(ended) - KEEP_JOBS)]
            for old in dropped:
                del self._jobs[old]
        for old in dropped:
            self._forget(old)

    def _run(self, job: Job, work: Work) -> None:
        if self._closing:
            return  # stays queued on disk: resumed at the next start
        job.state, job.started = "running", time.time()
        self._save(job)
        state: State = "failed"
        error: str | None = None
        try:
            job.result = work(job)
            state = "done"
        except JobInterrupted:
            error = (
                f"the control plane stopped during this job ({job.rows_done} of "
                f"{job.rows_total} rows written); submit it again (imports are upserts)"
            )
            state = "interrupted"
        except HPSError as exc:
            error = str(exc)
        except Exception as exc:  # a job must end in a state, whatever happened
            log.exception("job %s failed", job.id)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            job.remove_staged()  # before the end is visible: an ended job holds no upload
            job.finished = time.time()
            # an error body, on disk and in GET /v1/jobs/{id}: no secret in sight
            job.error, job.state = None if error is None else scrub(error), state
            try:
                self._save(job)
            finally:
                with self._lock:
                    self._futures.pop(job.id, None)
                    self._work.pop(job.id, None)
                    self._durations = [*self._durations[-9:], job.finished - job.started]

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no job {job_id!r}")
        return job

    def pending_targets(self, kind: str) -> set[str]:
        """The targets of the jobs of ``kind`` queued or running."""
        with self._lock:
            return {j.target for j in self._jobs.values() if j.kind == kind and j.state in PENDING}

    def load(self) -> tuple[int, int]:
        """(jobs pending or reserved, their staged bytes)."""
        with self._lock:
            return self._pending()

    def pending(self) -> JSON:
        """Pending jobs and staged bytes, with the limits."""
        count, nbytes = self.load()
        return {
            "pending": count,
            "staged_bytes": nbytes,
            "max_jobs": self.max_jobs,
            "max_staged_bytes": self.max_staged_bytes,
        }

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop: queued jobs stay queued (recorded: resumed at the next start); the running
        one is asked to stop at its next chunk and waited for up to ``wait_s``."""
        with self._lock:
            self._closing = True
            running = [j for j in self._jobs.values() if j.state == "running"]
            futures = list(self._futures.items())
        for job in running:
            job._stop.set()
        kept = [job_id for job_id, future in futures if future.cancel()]
        if kept or running:
            log.info(
                "stopping: %d queued job(s) kept for the next start, %d running asked to stop",
                len(kept),
                len(running),
            )
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + wait_s
        for _, future in futures:
            if future.cancelled():
                continue
            with contextlib.suppress(Exception):
                future.result(timeout=max(0.0, deadline - time.monotonic()))
        for job in running:
            if job.state == "running":  # still at work (e.g. in its reload): say so on disk
                record = Job.from_record(job.record())
                record.state = "interrupted"
                record.error = "the control plane stopped while this job ran; submit it again"
                record.finished = time.time()
                self._save(record)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
