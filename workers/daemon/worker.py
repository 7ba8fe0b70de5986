"""The worker loop: register, heartbeat, lease jobs, measure them, report the results.

Threads, each with one job:
- main: waits for the control thread and turns signals into stop requests (a signal handler
  only counts; events and log lines are handled here, outside the handler);
- control: registers, then, while it holds fewer than its slots plus `lease_ahead`, has the
  lease thread ask for jobs, and waits for its answer or a stop, whichever comes first; on
  stop, drains. A free slot's request long-polls; a request for a job ahead (every slot busy)
  takes only what is queued, without waiting (LeaseAsk says why);
- lease: makes the control thread's requests (`POST /v1/jobs/lease`), one at a time, on a
  client of its own, and hands the jobs to the measuring pool (the jobs beyond the slots
  wait there: the next trial starts the moment one ends, with no request in between). A
  blocked read cannot be interrupted, so a stop does not wait for the poll in flight: the
  control thread goes on without it, and the jobs it brings after the stop are handed back;
- measuring pool: `concurrency` threads for simulated/replay runners; one thread for cupy
  (the GPU runs one trial at a time; a batch is compiled in parallel by runner.prepare); a
  held job whose task was not heard of within CONFIRM_AFTER_S (it waited behind a long
  trial) starts once word of the task has come (the report of the trial that ended, or a
  heartbeat asked for): a cancelled task's held jobs are dropped unmeasured;
- reporter: posts the results measured since its last post in one request
  (`POST /v1/jobs/results`), with retries (workers.daemon.reporting), and leases in the same
  request the jobs the slots they free can take (`max_jobs`): a worker that keeps finding work
  that way makes one request per batch of trials instead of two (the control thread's
  long-poll is then for the jobs that request did not find);
- heartbeat: tells the service every few seconds that the worker lives and how busy it is,
  and extends its leases; idle, it tells it less often (workers.daemon.heartbeats); at once
  when a measuring thread asks (its answer's `gone` names a cancelled task's held jobs).

Stopping: the first SIGTERM (or SIGINT) stops leasing; the jobs in hand are measured and
reported, then the worker exits 0 (3 when some results could not be reported). A second one
(or --parent-pid's parent gone) stops after the current trial. Jobs the worker will not
measure (those not started after a second signal; those a lease request or a report in
flight when the stop came brings after it) are handed back (`POST /v1/jobs/release`: queued
again at once, no attempt used), one try of at most RELEASE_TIMEOUT_S; where that fails (the
service unreachable, or from before the route) they are left to their leases, which expire
and return them to the queue (heartbeats list only the leases the worker holds). Last, the
worker says that its process ends (`POST /v1/workers/{id}/exit`): the service counts it live
no more, and a restart under its name on another token is not refused for a lease TTL.

A lease request in flight at the stop (a long-poll may wait up to --lease-wait, and a blocked
read cannot be interrupted): the worker tells the service that it stops (`POST
/v1/workers/{id}/stopping`), which answers that request at once, on whichever replica it
waits, and leases the worker nothing more; the answer (empty, or the jobs it was claiming,
handed back) comes within a round trip, and the worker then exits. Before, an idle worker
exited with the poll still open, and jobs queued while its process ended (0.1-0.4 s after the
`stopped` line, measured against a live service) were leased into it, never read, and waited
out their TTL, an attempt used each. Where the service cannot be told (unreachable; from
before the route, a 404), the worker exits at once as before and that window stays: the
service, which looks whether its client went away each time the request is woken and
before it claims again (service.queue.Queue.lease), takes no job for it once the process's
exit has closed the connection. Run in-process (run() returns, the process lives on), the
lease thread waits for the poll's answer and hands its jobs back.

A result the service refuses as invalid (a value it cannot store: 400, 422) is reported
again, once, as a failed trial saying why, so that its job ends recorded (left to its lease,
it was measured and refused again after each TTL until recorded `lost`).

Reports failing: while the results route fails (the reporter retries; --result-retry counts
from the outage's start), leasing waits, so that the worker does not take jobs whose results
it could not deliver: the jobs in hand are measured and their reports queued. With nothing
left to report, the reporter sends a result again every REPORT_PROBE_S (the last one the
service acknowledged, which it answers as already recorded; before any, the last one given
up on, which may yet be recorded); once a report gets through, leasing resumes and the
results given up on in the outage are sent again (their leases may still be live; left to
them, each job waited out its TTL and used up an attempt).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from queue import Empty, Queue
from typing import Any, TypeVar

from pipetune.clients.sdk import (
    ApiError,
    AuthError,
    InvalidRequestError,
    NotFoundError,
    PipetuneError,
    WorkerApi,
)
from pipetune.model.family import parse_any_workload
from pipetune.model.states import JobState
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import (
    MAX_HELD_LEASES,
    MAX_JOBS_PER_LEASE,
    MAX_RESULTS_PER_POST,
    HeldLease,
    JobLease,
    JobResult,
    ReportedResult,
    WorkerRegister,
    new_request_id,
)
from pipetune.model.workloads import WorkloadError
from pipetune.workers.daemon.config import WorkerConfig
from pipetune.workers.daemon.gpu import DeviceInfo
from pipetune.workers.daemon.heartbeats import Doorbell, HeldTerm, heartbeat_due, idle_every
from pipetune.workers.daemon.logs import EventLog, Throttle
from pipetune.workers.daemon.reporting import (
    TRANSIENT,
    TRANSIENT_REGISTERED,
    call_with_retries,
)
from pipetune.workers.runners import Runner, RunnerClosedError, RunnerUnavailableError

T = TypeVar("T")

# A worker the service no longer knows (database reset) registers again; if that keeps
# happening the route itself is missing and the worker gives up.
MAX_REREGISTER = 3
# Jobs leased ahead wait at most about this long for their turn: a quarter of the service's
# default lease TTL, so a worker that dies holding them delays them little (the measured
# trial time sets how many that is).
LEASE_AHEAD_S = 30.0
# A worker whose request for jobs ahead found none asks again when what it holds changes (a
# trial reported), or after this long with its slots still busy (jobs queued since: a task
# created while it measures a long trial).
AHEAD_RECHECK_S = 5.0
# A worker that has just leased jobs asks for a job ahead this long after (at most half its
# measured trial time), not at once: the idle workers woken by the same batch claim theirs
# meanwhile. Asked at once, it reached the service before some of them and took jobs of the
# batch they waited for (benchmarks/RESULTS.md, "lease-ahead after the idle workers").
AHEAD_DEFER_S = 0.25
# A held job whose task the worker has not heard of as live for longer than this (it waited
# behind a long trial, or a compile) starts only once word of its task has come: the answer to
# the report of the task's last result, on its way already, or else a heartbeat sent for it;
# a task cancelled meanwhile names the job gone, and it is dropped unmeasured. Started at once,
# the first job held of a cancelled task was measured for nothing, its result then refused as
# "task cancelled". Ten seconds, not less: a worker measuring several tasks' jobs in turn (as
# tasks sharing a GPU take them) finds the next job of another task than the trial that
# ended, with no report of it on its way, and asks a heartbeat for it; at 1 s that was a
# heartbeat per trial of a second or more (a busy worker's own come about every 30 s, and a
# fleet's heartbeats are a service's load: workers/daemon/heartbeats.py). Jobs held less
# long start at once (a cancellation then costs at most one such trial); one held longer
# waits one round trip, a small part of what it waited already.
CONFIRM_AFTER_S = 10.0
# The longest a job waits for that word: an answer slow to come, the job is measured.
CONFIRM_WAIT_S = 2.0
REPORT_BATCH = 64  # results in one report at most
EXIT_UNREPORTED = 3  # the exit status of a worker that stopped with results it could not report
# Answers about a request's size (the body; the head): a batch refused so is sent again one
# result a request, not dropped as refused.
REQUEST_TOO_LARGE = (413, 431)
# After a 404 from the batch route the worker reports one result a request, and tries the
# route again this long after: the 404 may have come from an older replica behind a load
# balancer during a rolling upgrade, or from a proxy, not from every replica for good.
BATCH_ROUTE_RETRY_S = 600.0
# A stopping worker hands back the jobs it will not measure in one try of at most this long:
# a service that does not answer by then leaves them to their leases, and the worker exits.
RELEASE_TIMEOUT_S = 5.0
# How long a stopping worker waits for its lease request in flight to be answered once the
# service was told it stops (the answer is immediate; handing back what it brought takes up to
# RELEASE_TIMEOUT_S more).
STOP_POLL_WAIT_S = 2 * RELEASE_TIMEOUT_S
# While reports fail and none is left to send, the reporter sends one result again this often
# (leasing waits meanwhile): how it learns that the results route is back. As the longest
# backoff of a report's retries (workers.daemon.reporting).
REPORT_PROBE_S = 5.0
# The most results given up on that a worker keeps to send again once reports get through
# (the oldest are dropped beyond: their leases will have expired).
MAX_UNDELIVERED = 10_000

# One copy of a job in the worker's hands: (job id, lease token). A job whose lease expired
# while held (an outage longer than the TTL) can be leased to the same worker again, a second
# copy under a new token: known by its job id alone, the old copy's report released the new
# lease (no heartbeat extended it again) and a `gone` for the old lease dropped the new copy.
LeaseKey = tuple[int, str]


def _unknown_field(exc: ApiError) -> bool:
    """Whether a 422 refuses a field the service does not know (pydantic's extra_forbidden),
    rather than a value it judged."""
    detail = exc.body.get("detail") if isinstance(exc.body, dict) else None
    return isinstance(detail, list) and any(
        isinstance(d, dict) and d.get("type") == "extra_forbidden" for d in detail
    )


class WorkerError(PipetuneError):
    """The worker cannot go on (refused token, runner gone, service never reachable)."""


@dataclass(frozen=True)
class LeaseAsk:
    """One lease request of the control thread: `jobs` to ask for, and whether the request
    long-polls for them (`wait`); `holding`: the jobs the worker held when it asked.

    A worker with a free slot asks for its free slots and waits. One whose slots are all busy
    asks for one job ahead, and does not wait: it takes only a job already queued, and asks
    AHEAD_DEFER_S after the lease that brought its work (_ahead_wait_s). All three because
    idle workers are to get a batch's jobs before busy ones take more, and busy ones to share
    what is left (benchmarks/RESULTS.md, "lease-ahead after the idle workers"):
    - a request is sized when it is sent and answered when jobs come, and trials end
      meanwhile: a long-poll for jobs ahead, sent while the worker measured the last trial of
      a batch, was answered by the next batch with the worker idle by then, and took two of
      its jobs where an idle worker takes one;
    - asked the moment its lease came back, it reached the service before some of the idle
      workers woken by the same batch (with the two, 8 workers and a model-guided task of
      batches of 8: each batch was measured on 4-7 of them, the task 1.7-2.8x as long as
      without leasing ahead);
    - asking for all its jobs ahead at once, the first busy worker took them while another
      got none, and the batch waited on it (4 workers, batches of 8: 12.3 s a task against
      8.4 s without leasing ahead). One a request, the busy workers take the jobs left in
      turns, and each reaches its `lease_ahead` over several requests."""

    jobs: int
    wait: bool
    holding: int


def _workload_key(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)


def _lease_key(job: JobLease) -> LeaseKey:
    return (job.job_id, job.lease_token)


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        runner: Runner,
        device: DeviceInfo,
        log: EventLog,
        api_factory: Callable[[], WorkerApi] | None = None,
    ):
        self.config = config
        self.runner = runner
        self.device = device
        self.log = log
        self._api_factory = api_factory or (lambda: WorkerApi(config.server, config.token))
        self.worker_id: int | None = None
        self.counts: Counter[str] = Counter()
        self._signals = 0  # incremented by the signal handler (no locks in a handler)
        self._seen_signals = 0
        self._stop = threading.Event()  # lease no more; finish the jobs in hand
        self._abort = threading.Event()  # start no more trials; stop retrying reports
        self._fatal: BaseException | None = None
        self._busy = 0
        # The leases held: leased and not yet reported, at most one a job (a newer lease of
        # a job retires the older copy: _hold). Heartbeats list them, and the service
        # extends only those (wire.Heartbeat says why).
        self._held: dict[LeaseKey, HeldTerm] = {}
        # Whether the last heartbeat failed: no lease is extended meanwhile, and none is
        # leased ahead (_capacity).
        self._heartbeats_failing = False
        # The task of each held lease: a result refused because its task was cancelled drops
        # the task's other jobs held ahead at once, not at the next heartbeat's `gone`
        # (a busy worker beats about every 30 s, and would measure them meanwhile).
        self._task_of: dict[LeaseKey, int] = {}
        # When each held job's task was last heard of as live (time.monotonic()): a lease of
        # it granted, a result of it accepted, a heartbeat listing a lease of it and not naming
        # it gone; and the tasks of the results queued or being reported (how many of each).
        # A held job's task not heard of lately is asked about before it starts
        # (_await_word_of_task).
        self._task_heard: dict[int, float] = {}
        self._reporting: Counter[int] = Counter()
        # A heartbeat a measuring thread asked for (_await_word_of_task), how many of those
        # the heartbeat thread has answered (sent, or failed), and how to wake it (_serve).
        self._beat_asked = False
        self._asked_beats = 0
        self._ring_heartbeat: Callable[[], None] | None = None
        # Since when the reporter's requests have failed without a success between (None:
        # the last one went through). --result-retry counts from there for every report: a
        # worker draining several batches through an outage gave each its own 900 s.
        # Leasing waits while it is set (_free_slots): a worker whose results route failed
        # and whose leases went through measured job after job and lost every result.
        self._reports_failing_since: float | None = None
        # What the reporter sends again while reports fail and none is left to send (its
        # probe, _probe_reports): a result the service acknowledged (answered as already
        # recorded), else the last one given up on; and whether it is the latter.
        self._probe_with: tuple[JobLease, MeasureResult] | None = None
        self._probe_given_up = False
        # Results given up on in an outage (reporter thread only): sent again once reports
        # get through (_resend_undelivered), where each was left to its lease, whose expiry
        # used up one of its job's attempts.
        self._undelivered: list[tuple[JobLease, MeasureResult]] = []
        # Held jobs whose leases the service says are no longer this worker's (a heartbeat's
        # `gone`: the task cancelled, the lease moved): not measured if not started yet.
        self._gone: set[LeaseKey] = set()
        # Copies in hand whose job was leased to this worker again since (_hold): their
        # leases are no longer current, so they are not measured if not started yet.
        self._superseded: set[LeaseKey] = set()
        self._told_short_ttl = False  # that a lease's TTL is no longer than --heartbeat
        self._shortest_ttl_s: float | None = None  # of the leases granted (heartbeat interval)
        self._service_ttl_s: float | None = None  # the lease TTL its registration answer gave
        self._heartbeat_lists_leases = True  # until a service from before it says otherwise
        # Set when a request failed as an outage does (unreachable, 5xx, garbled answer): the
        # service may have come back on another database, where this worker's id names
        # another worker (ids start at 1 again) and a lease under it takes that worker's
        # jobs, of its GPU. Until the worker registers again (by name: the same id on the
        # same database), reports lease nothing and the next lease request registers first.
        self._reregister = threading.Event()
        # Jobs asked for by the lease requests in flight, counted against the capacity
        # from the moment each is decided (under self._slots) until its answer is held: the
        # control thread's lease request, and the reporter's report that leases.
        self._asking = 0  # the control thread's (reserved by _free_slots)
        self._report_asking = 0  # the reporter's (reserved by _lease_with_report)
        self._leases_in_reports = True  # the service takes max_jobs in a report (until it says)
        self._slots = threading.Condition()
        # The measuring pool while it takes jobs (the reporter hands it jobs it leased too).
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # The control thread's lease requests (LeaseAsk; None: no more), made by the lease
        # thread, and its answer (under self._slots): the jobs it got, or its error.
        self._poll_requests: Queue[LeaseAsk | None] = Queue()
        self._poll_answer: int | BaseException | None = None
        self._polling = False  # a lease request in flight (under self._slots)
        # The last request for jobs ahead that found none: (jobs held then, when), and when a
        # lease last brought jobs (time.monotonic()): when to ask ahead next (_ahead_wait_s).
        self._found_none_ahead: tuple[int, float] | None = None
        self._leased_at = -math.inf
        # Jobs let go unmeasured in the measuring pool (a second signal, the runner gone):
        # handed back together once the pool has stopped (under self._slots).
        self._to_hand_back: list[JobLease] = []
        self._reports: Queue[tuple[JobLease, MeasureResult] | None] = Queue()
        self._throttle = Throttle()
        self._serial = runner.name == "cupy"
        self._counts_lock = threading.Lock()
        self._trial_s: float | None = None  # moving average of a trial's measuring time

    # ---- stopping -----------------------------------------------------------------------

    def signal_handler(self, signum: int, frame: Any) -> None:
        self._signals += 1

    def request_stop(self) -> None:
        """What a SIGTERM does, for callers that run the worker in-process."""
        self._signals += 1

    def _watch_parent(self) -> None:
        """With --parent-pid: once that process is gone (this one was re-parented), stop as
        two signals do. The service it ran is gone with it, so the results in hand could
        not be reported; their leases expire and a service started again re-runs them."""
        parent = self.config.parent_pid
        if parent is None or self._abort.is_set() or os.getppid() == parent:
            return
        self.log.warning("parent_gone", parent=parent, msg="the process that started me ended")
        self._signals += 2

    def _stopping(self) -> bool:
        """Whether the worker stops: also a signal counted that the main thread has not
        turned into a stop yet (it looks every 0.2 s)."""
        return self._stop.is_set() or self._signals > 0

    def _handle_signals(self) -> None:
        n = self._signals
        if n == self._seen_signals:
            return
        first, self._seen_signals = self._seen_signals == 0, n
        self._stop.set()
        # Said on the first signal even where the lease thread saw it first (`_stopping`) and
        # the stop was set before this thread looked: the operator's word that the worker
        # drains was missing then, though it drained.
        if first:
            msg = "no more leases; finishing the jobs in hand"
            if self._reports_failing_since is not None:
                # (Its reports may be retried for --result-retry: a supervisor's kill would
                # come first, without a word of why the worker did not stop.)
                msg += (
                    f" and reporting them, retried for up to {self._result_retry_left():.0f} s "
                    "while the service does not answer; a second signal stops without them"
                )
            self.log.info("draining", busy=self._busy, msg=msg)
        if n >= 2 and not self._abort.is_set():
            self._abort.set()
            self.log.warning("aborting", msg="stopping after the current trial")
        with self._slots:
            self._slots.notify_all()

    # ---- main ---------------------------------------------------------------------------

    def run(self) -> int:
        """Work until stopped; 0 after a clean drain, EXIT_UNREPORTED when results measured
        could not be reported. Raises WorkerError (or the SDK's error) when the worker
        cannot start or must give up."""
        control = threading.Thread(target=self._control, name="pipetune-control", daemon=True)
        control.start()
        while control.is_alive():
            control.join(0.2)
            self._watch_parent()
            self._handle_signals()
        self._handle_signals()  # (a signal the control thread's end came before)
        if self._fatal is not None:
            raise self._fatal
        if self.counts["unreported"]:
            # Measured and never delivered (the service was gone past --result-retry, or a
            # second signal cut the retries short): a supervisor should know.
            self.log.warning("stopped", worker=self.worker_id, **dict(self.counts))
            return EXIT_UNREPORTED
        self.log.info("stopped", worker=self.worker_id, **dict(self.counts))
        return 0

    def _control(self) -> None:
        api = None
        try:
            # Inside the try: an API that cannot be made (a token no header can carry) is
            # this thread's fatal error, which run() raises, not a thread's traceback and a
            # clean exit 0.
            api = self._api_factory()
            if not self._register(api):
                return  # stopped before the service answered
            self._serve(api)
        except BaseException as exc:
            self._fatal = exc
        finally:
            if api is not None:
                api.close()

    def _serve(self, api: WorkerApi) -> None:
        workers = 1 if self._serial else self.config.concurrency
        hb_stop = Doorbell()
        self._ring_heartbeat = hb_stop.ring
        heartbeat = threading.Thread(
            target=self._heartbeat, args=(hb_stop,), name="pipetune-heartbeat", daemon=True
        )
        reporter = threading.Thread(target=self._reporter, name="pipetune-reporter", daemon=True)
        heartbeat.start()
        reporter.start()
        pool = ThreadPoolExecutor(workers, thread_name_prefix="pipetune-measure")
        self._pool = pool
        try:
            self._lease_loop(api)
        finally:
            # Stopped whatever ended the loop (a lease refused for good, too): the reports
            # of the jobs in hand lease nothing that the closed pool would abandon.
            self._stop.set()
            with self._pool_lock:
                self._pool = None  # the reporter's leases from now on are abandoned
            pool.shutdown(wait=True)  # the jobs in hand are measured (or abandoned on abort)
            with self._slots:
                left, self._to_hand_back = self._to_hand_back, []
            self._hand_back(api, left)
            self._reports.put(None)
            reporter.join()
            hb_stop.set()
            heartbeat.join()
            self._say_exit(api)

    def _say_exit(self, api: WorkerApi) -> None:
        """Tell the service that this process ends (`POST /v1/workers/{id}/exit`), after the
        last report and heartbeat: it counts the worker live no more, and a restart on
        another token (a rotation) may take the name at once, where it was refused for a
        lease TTL. One try of at most RELEASE_TIMEOUT_S, skipped where the reports were
        failing (the service is unreachable: the stop would wait for nothing); where it is
        not heard, the worker stays live for a TTL, as before."""
        if self.worker_id is None or self._reports_failing_since is not None:
            return
        try:
            api.exiting(self.worker_id, RELEASE_TIMEOUT_S)
        except Exception as exc:  # (an exit goes on whatever the answer)
            self.log.event("exit_unheard", "debug", msg=f"{type(exc).__name__}: {exc}")

    # ---- registration -------------------------------------------------------------------

    def _registration(self) -> WorkerRegister:
        d = self.device
        return WorkerRegister(
            gpu=d.gpu,
            name=self.config.name,
            arch=d.arch,
            runner=self.config.runner,  # type: ignore[arg-type]
            device_name=d.device_name[:256],
            sm_count=d.sm_count,
            driver=d.driver,
            clocks_mhz=d.clocks_mhz,
            workload=self.runner.only_workload,
        )

    def _register(self, api: WorkerApi) -> bool:
        """Register, retrying while the service is unreachable for register_timeout_s; False
        when stopped before the service answered."""
        body = self._registration()

        def waiting(attempt: int, exc: BaseException, wait_s: float) -> None:
            if self._throttle("register", time.monotonic()):
                self.log.warning("waiting_for_service", server=api.base_url, msg=str(exc))

        try:
            doc = call_with_retries(
                lambda: api.register(body),
                give_up_after_s=self.config.register_timeout_s,
                abort=self._stop,
                on_retry=waiting,
            )
        except TRANSIENT:
            if self._stop.is_set():
                return False
            raise
        except InvalidRequestError as exc:
            if body.workload is not None and exc.field == "workload":
                # Registered without it, the worker would lease every workload's jobs and
                # fail the trials its runner cannot answer: other users' tasks.
                raise WorkerError(
                    f"the service at {api.base_url} does not take the one workload a "
                    f"{self.runner.name} worker answers (it is older than this worker): "
                    "upgrade it, or run this worker against a service of its own"
                ) from None
            raise
        self._registered(doc, body, api)
        return True

    def _registered(
        self, doc: Any, body: WorkerRegister, api: WorkerApi, again: bool = False
    ) -> None:
        before, self.worker_id = self.worker_id, doc.id
        self._service_ttl_s = getattr(doc, "lease_ttl_s", None)
        if again:  # registered again after an outage (_lease)
            if doc.id != before:
                self.log.warning(
                    "registered_again",
                    worker=doc.id,
                    was=before,
                    msg="the service came back with another worker under this worker's id "
                    "(a new database?): this worker goes on under its new id",
                )
            return  # (the name is in use: by this worker, whose heartbeats it heard)
        if doc.name_in_use:
            # Two processes under one name share one worker: one row, one busy count, one
            # name on every trial. (Their leases stay apart: each heartbeat lists its own.)
            self.log.warning(
                "name_in_use",
                name=doc.name,
                msg="a worker of this name sent a heartbeat less than a lease TTL ago: if "
                "another process runs under it, give each its own --name (a restart just "
                "after a stop also shows this)",
            )
        self.log.info(
            "registered",
            worker=doc.id,
            name=doc.name,
            gpu=doc.gpu,
            arch=doc.arch,
            runner=doc.runner,
            workload=body.workload.label() if body.workload is not None else None,
            device=self.device.device_name,
            concurrency=self.config.concurrency,
            server=api.base_url,
        )

    # ---- leasing ------------------------------------------------------------------------

    def _capacity(self) -> int:
        """Jobs to hold: the slots, plus the ones leased ahead that fit in LEASE_AHEAD_S at
        the measured trial time (all of `lease_ahead` until a trial was timed)."""
        ahead = self.config.lease_ahead
        if self._heartbeats_failing:
            # Jobs held ahead wait on heartbeats to extend their leases: while none gets
            # through, they expired in the queue, were measured for nothing and came back
            # to this worker until the service gave them up as lost.
            ahead = 0
        if self._trial_s is not None and self._trial_s > 0:
            slots = 1 if self._serial else self.config.concurrency
            ahead = min(ahead, int(LEASE_AHEAD_S * slots / self._trial_s))
        return self.config.concurrency + ahead

    def _wanted(self, holding: int) -> int:
        """How many jobs a report's lease may bring the worker to, holding `holding`: the
        capacity once the worker has work in hand, only its slots while it holds none. An idle
        worker that asked for its slots plus its lease-ahead took a whole batch while the idle
        workers beside it waited (8 jobs of a batch on 3 of 8 workers, the batch 2x slower): it
        leases ahead once it has work, from the jobs no idle worker's request took. (A report
        claims at once and never waits: the control thread's requests follow LeaseAsk.)"""
        return self._capacity() if holding > 0 else self.config.concurrency

    def _free_slots(self) -> LeaseAsk:
        """Block until the worker holds, and asks for, fewer jobs than its capacity, its
        reports get through (or stop), and, with every slot busy, a request for jobs ahead is
        due (_ahead_wait_s); then the request to make (LeaseAsk), its jobs reserved for it
        (`_asking`) in the same lock: a report could otherwise lease them too in between (and
        a report's lease in flight, `_report_asking`, is theirs already)."""
        with self._slots:
            while not self._stop.is_set():
                if (
                    self._busy + self._report_asking >= self._capacity()
                    or self._reports_failing_since is not None  # (woken by _reports_through)
                ):
                    self._slots.wait(0.5)
                elif (not_yet := self._ahead_wait_s(self._busy + self._report_asking)) > 0:
                    self._slots.wait(min(0.5, not_yet))
                else:
                    break
            holding = self._busy + self._report_asking
            if self._stop.is_set():
                return LeaseAsk(0, True, holding)
            idle_slots = self.config.concurrency - holding
            wait = idle_slots > 0
            free = idle_slots if wait else min(1, self._capacity() - holding)  # (one ahead)
            self._asking = max(0, min(free, MAX_JOBS_PER_LEASE))
            return LeaseAsk(self._asking, wait, holding)

    def _ahead_wait_s(self, holding: int) -> float:
        """How long the control thread's next request waits yet before it is sent, holding
        `holding` (0: now). A free slot's goes at once. One for jobs ahead goes AHEAD_DEFER_S
        after the worker's last lease that brought jobs (half a trial where trials are
        shorter), and AHEAD_RECHECK_S after the last one that found none where the worker
        holds what it held then. (The caller holds self._slots.)"""
        if holding < self.config.concurrency:
            return 0.0
        defer_s = AHEAD_DEFER_S if self._trial_s is None else min(AHEAD_DEFER_S, self._trial_s / 2)
        due = self._leased_at + defer_s
        dry = self._found_none_ahead
        if dry is not None and dry[0] == holding:
            due = max(due, dry[1] + AHEAD_RECHECK_S)
        return due - time.monotonic()

    def _hold(self, jobs: list[JobLease]) -> None:
        """Count jobs just leased as held (the caller holds self._slots)."""
        if jobs:
            self._found_none_ahead = None  # (what it holds changed: _ahead_wait_s)
            self._leased_at = time.monotonic()
        self._busy += len(jobs)
        now = time.monotonic()
        for job in jobs:
            self._retire_older_copies(job)
            key = _lease_key(job)
            self._held[key] = HeldTerm.granted(job.lease_token, job.lease_ttl_s, now)
            self._task_of[key] = job.task_id
            self._task_heard[job.task_id] = now  # (leased: its task is live)
        ttls = [j.lease_ttl_s for j in jobs if j.lease_ttl_s is not None]
        if ttls:
            self._shortest_ttl_s = min(self._shortest_ttl_s or math.inf, *ttls)
        if ttls and min(ttls) <= self.config.heartbeat_s and not self._told_short_ttl:
            # No heartbeat rule extends a lease that expires between two wake-ups: the
            # wake-ups come more often (they were only warned of, and a trial measured well
            # three times was recorded lost, its leases expired each time). Said once.
            self._told_short_ttl = True
            self.log.warning(
                "lease_ttl_below_heartbeat",
                msg=f"the service leases for {min(ttls):g} s, no longer than --heartbeat "
                f"{self.config.heartbeat_s:g} s: the heartbeat wakes every "
                f"{self._heartbeat_interval_s():g} s instead",
            )

    def _heartbeat_interval_s(self) -> float:
        """Seconds between the heartbeat thread's wake-ups: --heartbeat, or a quarter of the
        shortest lease TTL the service granted or said where that is shorter
        (heartbeats.HeldTerm extends a lease with half its TTL to spare, which wake-ups
        longer than the TTL cannot do)."""
        ttls = [t for t in (self._shortest_ttl_s, self._service_ttl_s) if t is not None]
        if not ttls:
            return self.config.heartbeat_s
        return min(self.config.heartbeat_s, min(ttls) / 4)

    def _retire_older_copies(self, job: JobLease) -> None:
        """A job leased to this worker again while it still holds an older copy (that
        copy's lease expired, and the job came back to it): the older lease cannot be
        current any more. It is no longer held (heartbeats list one lease a job: the
        service's `gone` names jobs, not leases), and the copy is not measured if it has not
        started (_is_superseded); one being measured finishes and is reported, and the
        service refuses its result as stale. (The caller holds self._slots.)"""
        older = [key for key in self._held if key[0] == job.job_id and key[1] != job.lease_token]
        for key in older:
            del self._held[key]
            self._task_of.pop(key, None)
            self._gone.discard(key)
            self._superseded.add(key)

    def _release(self, jobs: list[JobLease], reported: bool = False) -> None:
        """The jobs are done with (reported, or abandoned): their slots are free, and their
        leases no longer extended (an abandoned job's lease expires). Only each job's own
        lease: a copy superseded by a newer lease of its job leaves that one held.
        `reported`: the reporter is done with their results (_reporting)."""
        with self._slots:
            self._busy -= len(jobs)
            self._found_none_ahead = None  # (what it holds changed: _ahead_wait_s)
            for job in jobs:
                key = _lease_key(job)
                self._held.pop(key, None)
                self._task_of.pop(key, None)
                self._gone.discard(key)
                self._superseded.discard(key)
                if reported:
                    self._reporting[job.task_id] -= 1
                    if self._reporting[job.task_id] <= 0:
                        del self._reporting[job.task_id]
            held_tasks = set(self._task_of.values())
            for task_id in [t for t in self._task_heard if t not in held_tasks]:
                del self._task_heard[task_id]  # (no job of it held: nothing to ask about)
            self._slots.notify_all()

    def _held_leases(self) -> list[HeldLease]:
        with self._slots:
            return [HeldLease(job_id=j, lease_token=t) for j, t in self._held]

    def _count(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[key] += n
            if self.counts[key] == 0:
                del self.counts[key]  # (a result given up on, delivered after all)

    def _lease(self, api: WorkerApi, free: int, wait: bool = True) -> list[JobLease]:
        """One lease request, retried with backoff while the service is unreachable or
        answers 5xx; [] once the worker is stopping. The jobs count as held before the
        request ends (`_asking`): the reporter leases only what this one does not ask for.
        `wait`: long-poll for them (--lease-wait); else take only what is queued now."""
        assert self.worker_id is not None
        asking = min(free, MAX_JOBS_PER_LEASE)
        # One id for the request and its retries: a retry after an answer lost on the way
        # gets the jobs that answer held, not more (they waited out their TTL).
        request_id, tries = new_request_id(), 0
        with self._slots:
            self._asking = asking

        def failed(attempt: int, exc: BaseException, wait_s: float) -> None:
            self._reregister.set()
            if self._throttle("lease", time.monotonic()):
                self.log.warning("lease_failed", retry_in_s=wait_s, msg=str(exc))

        def lease() -> list[JobLease]:
            nonlocal tries
            if self._reregister.is_set():
                # (Cleared first: a failure seen by another thread meanwhile sets it again.)
                self._reregister.clear()
                try:
                    body = self._registration()
                    self._registered(api.register(body), body, api, again=True)
                except BaseException:
                    self._reregister.set()
                    raise
            assert self.worker_id is not None
            tries += 1
            return api.lease(
                self.worker_id,
                max_jobs=asking,
                wait_s=self.config.lease_wait_s if wait else 0.0,
                request_id=request_id,
                retry=tries > 1,
            )

        jobs: list[JobLease] = []
        try:
            jobs = call_with_retries(
                lease,
                give_up_after_s=None,
                abort=self._stop,
                on_retry=failed,
                transient=TRANSIENT_REGISTERED,
            )
        except TRANSIENT_REGISTERED:
            pass  # stopping (the retries end only then): no jobs
        finally:
            with self._slots:
                self._asking = 0
                self._hold(jobs)
                self._slots.notify_all()
        return jobs

    def _lease_loop(self, api: WorkerApi) -> None:
        poller = threading.Thread(target=self._poller, name="pipetune-lease", daemon=True)
        poller.start()
        try:
            self._lease_until_stopped(api)
        finally:
            # The lease thread ends once the poll in flight, if any, is answered.
            self._poll_requests.put(None)
            with self._slots:
                polling = self._polling
            if polling:
                self._end_poll(api, poller)

    def _end_poll(self, api: WorkerApi, poller: threading.Thread) -> None:
        """The worker stops with a lease request in flight: tell the service, which answers
        the request at once (empty, or with the jobs it was claiming, which the lease thread
        hands back) and leases this worker nothing more, and wait up to STOP_POLL_WAIT_S for
        that answer. Until it comes the poll's connection is open: jobs enqueued while the
        process ended were leased into it, never read, and waited out their TTL. A service
        that cannot be told (unreachable, or from before the route) leaves the poll to run
        its course, as before."""
        assert self.worker_id is not None
        try:
            api.stopping(self.worker_id, RELEASE_TIMEOUT_S)
        except Exception as exc:  # (a stop goes on whatever the answer)
            self.log.event("stopping_unheard", "debug", msg=f"{type(exc).__name__}: {exc}")
            return
        poller.join(STOP_POLL_WAIT_S)

    def _lease_until_stopped(self, api: WorkerApi) -> None:
        reregistered = 0
        while not self._stop.is_set():
            ask = self._free_slots()
            if ask.jobs == 0:
                continue
            started = time.monotonic()
            answer = self._poll(ask)
            if answer is None:
                return  # stopping: the poll in flight hands back what it brings (_hand_over)
            if isinstance(answer, NotFoundError):
                reregistered += 1
                if reregistered > MAX_REREGISTER:
                    raise WorkerError(f"the service keeps refusing leases: {answer}") from None
                self.log.warning("unknown_worker", msg=f"{answer}; registering again")
                if not self._register(api):
                    return
                continue
            if isinstance(answer, AuthError):
                # As it is, so the CLI says which credential was refused and where it comes
                # from (a worker token refused mid-run read as a bare refusal, exit 1).
                raise answer
            if isinstance(answer, ApiError):
                raise WorkerError(f"the service refused to lease jobs: {answer}") from None
            if isinstance(answer, BaseException):
                raise answer
            reregistered = 0
            if not ask.wait:
                if answer == 0:  # (jobs found cleared it: _hold)
                    with self._slots:
                        self._found_none_ahead = (ask.holding, time.monotonic())
            elif answer == 0 and time.monotonic() - started < 0.2:
                self._stop.wait(1.0)  # a service that does not long-poll

    def _poll(self, ask: LeaseAsk) -> int | BaseException | None:
        """Have the lease thread make the request (up to `ask.jobs` jobs), and wait for its
        answer: how many it got (it hands them over itself) or its error; None once the
        worker stops first. The poll then goes on without a waiter, and its jobs are handed
        back (_hand_over): a stop does not wait out a long-poll (--lease-wait) that cannot be
        interrupted."""
        with self._slots:
            self._poll_answer = None
            self._polling = True
        self._poll_requests.put(ask)
        with self._slots:
            while self._poll_answer is None:
                if self._stopping():
                    return None
                self._slots.wait(0.5)  # (woken by the answer, and by a stop: _handle_signals)
            answer, self._poll_answer = self._poll_answer, None
            return answer

    def _poller(self) -> None:
        """The lease thread: the control thread's lease requests, one at a time. Its own
        client, not the control thread's: a poll may still be in flight when that one is
        closed, and its jobs are handed back over it."""
        api = None
        try:
            api = self._api_factory()
            while (ask := self._poll_requests.get()) is not None:
                self._answer_poll(self._poll_once(api, ask))
        except BaseException as exc:  # (the control thread raises it: run() does)
            self._answer_poll(exc)
        finally:
            if api is not None:
                api.close()

    def _poll_once(self, api: WorkerApi, ask: LeaseAsk) -> int | BaseException:
        try:
            jobs = self._lease(api, ask.jobs, ask.wait)
        except Exception as exc:  # the control thread's to judge (register again, give up)
            return exc
        if jobs:
            self.log.event("leased", "debug", jobs=len(jobs))
            self._count("leased", len(jobs))
            self._hand_over(jobs, api)
        return len(jobs)

    def _answer_poll(self, answer: int | BaseException) -> None:
        with self._slots:
            self._poll_answer = answer
            self._polling = False
            self._slots.notify_all()

    def _hand_over(self, jobs: list[JobLease], api: WorkerApi) -> None:
        """Jobs leased (and counted as held) to the measuring pool; handed back unmeasured
        if the worker is stopping (a lease request or a report in flight when the stop came
        brought them after it: a draining worker measured them, one stopping after the
        current trial left them to their leases) or the pool is closed."""
        foreign = [job for job in jobs if job.gpu != self.device.gpu]
        if foreign:
            # Not this GPU's jobs: the service leased them to this worker's id as another
            # GPU's worker (its name re-registered as another kind while this process was
            # silent). Measured here they would be recorded as that GPU's timings.
            for job in foreign:
                self._unmeasured(
                    job,
                    "another_gpus_job",
                    "error",
                    f"not measured: a job of the {job.gpu}, and this worker measures the "
                    f"{self.device.gpu} "
                    "(did another process register this worker's --name as another GPU?)",
                )
            self._hand_back(api, foreign)
            jobs = [job for job in jobs if job.gpu == self.device.gpu]
        with self._pool_lock:
            if self._pool is not None and not self._stopping():
                for unit in self._units(jobs):
                    self._pool.submit(self._measure_unit, unit)
                return
        for job in jobs:
            self._unmeasured(
                job, "handed_back", "info", "not measured: leased as the worker stopped"
            )
        self._hand_back(api, jobs)

    def _hand_back(self, api: WorkerApi, jobs: list[JobLease]) -> None:
        """Hand jobs this worker lets go unmeasured back to the service (queued again at
        once, no attempt used): one try, of at most RELEASE_TIMEOUT_S, not to hold up a
        stop. Where it fails (the service unreachable, or from before the route), their
        leases expire and return them to the queue, as before."""
        if not jobs or self.worker_id is None:
            return
        released = 0
        try:
            for i in range(0, len(jobs), MAX_HELD_LEASES):
                leases = [
                    HeldLease(job_id=job.job_id, lease_token=job.lease_token)
                    for job in jobs[i : i + MAX_HELD_LEASES]
                ]
                released += len(api.release(self.worker_id, leases, RELEASE_TIMEOUT_S))
        except Exception as exc:  # (a stop goes on whatever the answer)
            self.log.warning(
                "release_failed",
                jobs=len(jobs) - released,
                msg=f"left to their leases, which expire: {type(exc).__name__}: {exc}",
            )
        if released:
            self._count("released", released)
            self.log.info("released", jobs=released, msg="handed back to the queue")

    def _lease_with_report(self, reported: int) -> int:
        """How many jobs a report of `reported` results may lease: what the slots those
        results free can take, less what a lease request in flight asks for; none once the
        worker is stopping. Reserved (`_report_asking`) until the report's answer is held
        (_report_batch), so that the control thread does not lease them meanwhile."""
        with self._slots:
            if self._stopping() or not self._leases_in_reports or self._reregister.is_set():
                self._report_asking = 0
                return 0
            holding = self._busy - reported + self._asking
            free = self._wanted(holding) - holding
            self._report_asking = max(0, min(free, MAX_JOBS_PER_LEASE))
            return self._report_asking

    def _units(self, jobs: list[JobLease]) -> list[list[JobLease]]:
        """Jobs grouped by workload for the GPU (one prepare compiles a group in parallel);
        one job per unit for simulated/replay, so the pool's threads share the work."""
        if not self._serial:
            return [[job] for job in jobs]
        groups: dict[str, list[JobLease]] = {}
        for job in jobs:
            groups.setdefault(_workload_key(job.workload), []).append(job)
        return list(groups.values())

    # ---- measuring ----------------------------------------------------------------------

    def _failure(self, error: str) -> MeasureResult:
        return MeasureResult(status="runtime_error", error=error[:2000], runner=self.runner.name)

    def _measure_unit(self, jobs: list[JobLease]) -> None:
        done = 0
        try:
            try:
                workload: Any = parse_any_workload(jobs[0].workload)
            except WorkloadError as exc:
                for job in jobs:
                    self._finish(job, self._failure(f"worker: bad workload: {exc}"))
                    done += 1
                return
            schedules = [job.schedule.to_schedule() for job in jobs]
            if len(jobs) > 1:
                try:
                    self.runner.prepare(workload, schedules)  # parallel NVRTC (cupy)
                except Exception as exc:  # measure() reports what could not be built
                    self.log.warning("prepare_failed", msg=str(exc))
            for job, schedule in zip(jobs, schedules, strict=True):
                if not (self._abort.is_set() or self._fatal is not None):
                    self._await_word_of_task(job)
                if self._abort.is_set() or self._fatal is not None:
                    self._set_aside(job)
                elif self._is_gone(job):
                    self._drop(job)
                elif self._is_superseded(job):
                    self._retire(job)
                elif self._has_expired(job):
                    self._expired(job)
                else:
                    self._finish(job, self._measure_one(workload, schedule))
                done += 1
        except BaseException as exc:  # never lose a slot to a bug
            self.log.error("unit_failed", msg=f"{type(exc).__name__}: {exc}")
            # The job being measured may be what broke the runner: left to its lease, whose
            # expiry counts an attempt (a job that breaks every worker is given up on after
            # max_attempts; handed back, it would not be). The ones not started go back.
            for i, job in enumerate(jobs[done:]):
                if i == 0:
                    self._abandon(job)
                else:
                    self._set_aside(job)

    def _measure_one(self, workload: Any, schedule: Any) -> MeasureResult:
        started = time.monotonic()
        try:
            result = self.runner.measure(workload, [schedule])[0]
            took = time.monotonic() - started
            self._trial_s = took if self._trial_s is None else 0.8 * self._trial_s + 0.2 * took
            return result
        except (RunnerClosedError, RunnerUnavailableError) as exc:
            # The device is gone: nothing more can be measured here.
            self._fatal = WorkerError(f"the {self.runner.name} runner stopped: {exc}")
            self._stop.set()
            raise
        except Exception as exc:
            # The runner could not answer for this schedule (e.g. not in a replayed
            # dataset): a failed trial, so the task goes on.
            return self._failure(f"{self.runner.name} runner: {type(exc).__name__}: {exc}")

    def _await_word_of_task(self, job: JobLease) -> None:
        """Before a held job starts: where its task was last heard of as live more than
        CONFIRM_AFTER_S ago, wait up to CONFIRM_WAIT_S for word of it. The answer to a report
        of the task's results in flight tells (a result refused as "task cancelled" names the
        task's held jobs gone: _acknowledged); with none in flight, a heartbeat asked for now
        does (its `gone`). Not where no word can come: reports failing, heartbeats failing or
        not listing leases (a service from before), no heartbeat thread."""
        key = _lease_key(job)
        deadline = time.monotonic() + CONFIRM_WAIT_S
        asked: int | None = None  # the asked-for heartbeats answered when this one was asked
        with self._slots:
            while key in self._held and key not in self._gone and not self._abort.is_set():
                now = time.monotonic()
                heard = self._task_heard.get(job.task_id, -math.inf)
                if now - heard <= CONFIRM_AFTER_S or now >= deadline:
                    return
                if self._reports_failing_since is not None:
                    return
                if not self._reporting[job.task_id]:
                    if asked is None:
                        if (
                            self._ring_heartbeat is None
                            or self._heartbeats_failing
                            or not self._heartbeat_lists_leases
                        ):
                            return
                        asked, self._beat_asked = self._asked_beats, True
                        self._ring_heartbeat()
                        continue
                    if self._asked_beats != asked:
                        return  # (it was sent, or failed, and did not name the job gone)
                self._slots.wait(min(0.5, deadline - now))

    def _finish(self, job: JobLease, result: MeasureResult) -> None:
        with self._slots:
            self._reporting[job.task_id] += 1  # (until its report is done: _release)
        self._count("measured")
        self.log.info(
            "trial",
            task=job.task_id,
            trial=job.trial,
            job=job.job_id,
            schedule=job.schedule.to_schedule().id,
            status=result.status,
            latency_us=result.latency_us,
            runner=result.runner,
            error=None if result.ok else (result.error or "")[:200],
        )
        self._reports.put((job, result))

    def _is_gone(self, job: JobLease) -> bool:
        with self._slots:
            return _lease_key(job) in self._gone

    def _is_superseded(self, job: JobLease) -> bool:
        with self._slots:
            return _lease_key(job) in self._superseded

    def _has_expired(self, job: JobLease) -> bool:
        with self._slots:
            term = self._held.get(_lease_key(job))
        return term is not None and term.expired(time.monotonic())

    def _expired(self, job: JobLease) -> None:
        """A job held ahead whose lease expired while it waited (heartbeats failed for its
        TTL), not measured: its result would be refused as stale, and the job is leased
        again (to this worker too, as a newer copy)."""
        self._unmeasured(
            job,
            "expired",
            "warning",
            "not measured: its lease expired while it waited (no heartbeat got through to "
            "extend it); the service leases the job again",
        )

    def _drop(self, job: JobLease) -> None:
        """A job whose lease the service says is no longer this worker's, not measured: its
        slot goes to a job somebody wants."""
        self._unmeasured(
            job,
            "dropped",
            "info",
            "not measured: the service says its lease is no longer this worker's (the task "
            "cancelled, or the lease expired and moved)",
        )

    def _retire(self, job: JobLease) -> None:
        """An older copy of a job this worker was leased again, not measured: its lease
        expired (the service refuses its result), and the newer copy is measured."""
        self._unmeasured(
            job,
            "superseded",
            "info",
            "not measured: the job was leased to this worker again after this copy's lease "
            "expired; the newer copy is measured",
        )

    def _abandon(self, job: JobLease) -> None:
        self._unmeasured(
            job,
            "abandoned",
            "warning",
            "not measured; the lease will expire and the job return to the queue",
        )

    def _set_aside(self, job: JobLease) -> None:
        """A job not started that the measuring pool lets go (a second signal, the runner
        gone): handed back with the others once the pool has stopped (_serve), in one
        request rather than one a job."""
        self._unmeasured(
            job,
            "abandoned",
            "warning",
            "not measured; handed back to the queue as the worker stops (where that fails, "
            "its lease expires and returns it there)",
        )
        with self._slots:
            self._to_hand_back.append(job)

    def _unmeasured(self, job: JobLease, event: str, level: str, msg: str) -> None:
        """Let a held job go without measuring it: counted and said as `event`."""
        self._count(event)
        self.log.event(event, level, task=job.task_id, trial=job.trial, job=job.job_id, msg=msg)
        self._release([job])

    # ---- reporting ----------------------------------------------------------------------

    def _reporter(self) -> None:
        api = self._api_factory()
        # The service has POST /v1/jobs/results until it says otherwise, and again from
        # BATCH_ROUTE_RETRY_S after.
        per_result_until = -math.inf
        try:
            while True:
                self._resend_undelivered(api, time.monotonic() >= per_result_until)
                try:
                    item = self._reports.get(timeout=self._probe_in())
                except Empty:
                    self._probe_reports(api, time.monotonic() >= per_result_until)
                    continue
                if item is None:
                    self._resend_undelivered(api, time.monotonic() >= per_result_until)
                    return
                # Everything measured since the last report goes in one request.
                items, last = [item], False
                while len(items) < REPORT_BATCH:
                    try:
                        more = self._reports.get_nowait()
                    except Empty:
                        break
                    if more is None:
                        last = True
                        break
                    items.append(more)
                try:
                    batched = time.monotonic() >= per_result_until
                    if not self._report_all(api, items, batched) and batched:
                        per_result_until = time.monotonic() + BATCH_ROUTE_RETRY_S
                except Exception as exc:  # one bad answer must not stop the reporting
                    for job, _ in items:
                        self._count("unreported")
                        self.log.error(
                            "report_failed", job=job.job_id, msg=f"{type(exc).__name__}: {exc}"
                        )
                finally:
                    self._release([job for job, _ in items], reported=True)
                if last:
                    self._resend_undelivered(api, time.monotonic() >= per_result_until)
                    return
        finally:
            api.close()

    def _report_all(
        self,
        api: WorkerApi,
        items: list[tuple[JobLease, MeasureResult]],
        batched: bool,
        lease: bool = True,
    ) -> bool:
        """Report the results, in one request when the service takes them so; whether it
        does. A result the service refuses as invalid (422) is sent again on its own, so
        that only it is refused; a service without the route gets one request per result."""
        if batched:
            try:
                self._report_batch(api, items, lease)
                return True
            except NotFoundError:  # an older service: no batch route
                self.log.info(
                    "batch_reports_unsupported",
                    msg="reporting one result a request; trying the batch route again in "
                    f"{BATCH_ROUTE_RETRY_S:g} s",
                )
                batched = False
            except ApiError as exc:
                if exc.status_code == 422 and exc.field == "max_jobs" and self._leases_in_reports:
                    # A service from before reports leased: report as it takes them.
                    self._leases_in_reports = False
                    self.log.info("report_leases_unsupported", msg="leasing by lease requests")
                    return self._report_all(api, items, batched)
                if exc.status_code in REQUEST_TOO_LARGE:
                    # The request's size, not a judgement of the results (a proxy's body
                    # limit, long compile logs): these ones a request, the next batch again.
                    self.log.warning(
                        "report_too_large", jobs=len(items), status=exc.status_code,
                        msg="reporting these results one a request",
                    )  # fmt: skip
                    self._report_each(api, items)
                    return True
                if exc.status_code != 422:
                    for job, _ in items:
                        self._count("refused")
                        self.log.error(
                            "report_refused", job=job.job_id, status=exc.status_code, msg=exc.reason
                        )
                    return True
        self._report_each(api, items)
        return batched

    def _report_each(self, api: WorkerApi, items: list[tuple[JobLease, MeasureResult]]) -> None:
        for job, result in items:
            try:
                self._report(api, job, result)
            except Exception as exc:  # one bad answer must not stop the reporting
                self._count("unreported")
                self.log.error("report_failed", job=job.job_id, msg=f"{type(exc).__name__}: {exc}")

    def _result_retry_left(self) -> float:
        """Seconds the reporter may still retry: --result-retry less the outage so far."""
        since = self._reports_failing_since
        if since is None:
            return self.config.result_retry_s
        return max(0.0, self.config.result_retry_s - (time.monotonic() - since))

    def _reports_failing(self) -> None:
        if self._reports_failing_since is None:
            self._reports_failing_since = time.monotonic()
            self.log.warning(
                "leasing_paused", msg="reports are failing: no jobs leased until one gets through"
            )

    def _reports_through(self) -> None:
        """A report went through (or the service answered it): leasing resumes."""
        if self._reports_failing_since is None:
            return
        with self._slots:
            self._reports_failing_since = None
            self._slots.notify_all()
        self.log.info("leasing_resumed", msg="a report got through")

    def _probe_in(self) -> float | None:
        """How long the reporter waits for results before it probes (_probe_reports): only
        while reports fail (None: for ever)."""
        return REPORT_PROBE_S if self._reports_failing_since is not None else None

    def _probe_reports(self, api: WorkerApi, batched: bool) -> None:
        """Reports fail, leasing waits, and no result is left to send: one result sent
        again, once, so that the reporter learns when the results route is back. The last
        result the service acknowledged, which it answers as already recorded (a result of
        its own could make the service fail: then the outage would never end); before any
        was, the last one given up on, which the service may yet record."""
        probe, given_up = self._probe_with, self._probe_given_up
        if probe is None or self.worker_id is None:
            self._reports_through()  # (nothing to try with: the next report tells)
            return
        job, result = probe
        try:
            if batched:
                reported = ReportedResult(
                    job_id=job.job_id, lease_token=job.lease_token, result=result
                )
                (ack,) = api.post_results_and_lease(self.worker_id, [reported]).acks
                accepted = ack.status_code == 200 and ack.accepted
            else:
                body = JobResult(
                    worker_id=self.worker_id, lease_token=job.lease_token, result=result
                )
                accepted = api.post_result(job.job_id, body).accepted
        except TRANSIENT_REGISTERED as exc:  # (a 5xx among them) the next probe in a while
            self._reregister.set()
            self._probe_failed(job, exc)
            return
        except AuthError as exc:
            if exc.status_code == 401:  # (the worker's token refused: no report can go)
                self._token_refused(exc)
                return
            accepted = False
        except ApiError:
            accepted = False  # (refused: the service answered, the route is there)
        except Exception as exc:  # (an answer of the wrong shape: one ack for two results)
            self._probe_failed(job, exc)
            return
        self._reports_through()
        if accepted and given_up:
            self._count("unreported", -1)
            self._count("accepted")
            self._probe_with, self._probe_given_up = probe, False
            self._undelivered = [item for item in self._undelivered if item is not probe]
            self.log.info("result_delivered_late", job=job.job_id)

    def _probe_failed(self, job: JobLease, exc: BaseException) -> None:
        if self._throttle("report", time.monotonic()):
            self.log.warning("report_probe_failed", job=job.job_id, msg=str(exc))

    def _delivered(self, item: tuple[JobLease, MeasureResult]) -> None:
        """A result the service acknowledged: what a probe sends again from now on."""
        self._probe_with, self._probe_given_up = item, False

    def _given_up(self, items: list[tuple[JobLease, MeasureResult]]) -> None:
        """Results given up on: sent again once reports get through (_resend_undelivered);
        the last is what a probe sends where no result was acknowledged."""
        self._undelivered = (self._undelivered + items)[-MAX_UNDELIVERED:]
        if self._probe_with is None or self._probe_given_up:
            self._probe_with, self._probe_given_up = items[-1], True

    def _resend_undelivered(self, api: WorkerApi, batched: bool) -> None:
        """Once reports get through again, the results given up on in the outage are sent
        once more: their leases may still be live (or the service records a late result by
        its rule for them); left alone, each job waited out its lease and used up an
        attempt. Given up on again, they are kept for the next time."""
        if not self._undelivered or self._reports_failing_since is not None:
            return
        items, self._undelivered = self._undelivered, []
        self._count("unreported", -len(items))
        self.log.info("resending", results=len(items), msg="results given up on in an outage")
        try:
            self._report_all(api, items, batched, lease=False)
        except Exception as exc:  # one bad answer must not stop the reporting
            for job, _ in items:
                self._count("unreported")
                self.log.error("report_failed", job=job.job_id, msg=f"{type(exc).__name__}: {exc}")

    def _through_outage(
        self, call: Callable[[], T], log_retry: Callable[[int, BaseException, float], None]
    ) -> T:
        """call(), retried through an outage on the reporter's one clock (--result-retry from
        the outage's start, _result_retry_left); raises the last transient error once that
        runs out, or the service's refusal. A failure also has the next lease register again
        (_reregister)."""

        def on_retry(attempt: int, exc: BaseException, wait_s: float) -> None:
            self._reregister.set()
            self._reports_failing()
            log_retry(attempt, exc, wait_s)

        try:
            answer = call_with_retries(
                call,
                give_up_after_s=self._result_retry_left(),
                abort=self._abort,
                on_retry=on_retry,
                transient=TRANSIENT_REGISTERED,
            )
        except TRANSIENT_REGISTERED:
            self._reports_failing()
            raise
        except AuthError as exc:
            if exc.status_code == 401:
                self._token_refused(exc)
            else:
                self._reports_through()
            raise
        except ApiError:  # (the service answered: it is up)
            self._reports_through()
            raise
        self._reports_through()
        return answer

    def _token_refused(self, exc: AuthError) -> None:
        """A report's answer refused the worker's token (the service restarted without it):
        nothing the worker measures can be reported any more, so it stops after the current
        trial, with the refusal as its error. It took the answer for a report that got
        through, leased on and measured the jobs it held before its next lease was refused."""
        if self._fatal is None:
            self._fatal = exc
        self.log.error("token_refused", msg=f"{exc}: stopping after the current trial")
        self._stop.set()
        self._abort.set()
        with self._slots:
            self._slots.notify_all()

    def _report_batch(
        self, api: WorkerApi, items: list[tuple[JobLease, MeasureResult]], lease: bool = True
    ) -> None:
        """Report the results in one request (or one per MAX_RESULTS_PER_POST) and, with
        `lease`, lease with the last what the slots they free can take (results sent again
        after an outage free none)."""
        assert self.worker_id is not None
        worker_id = self.worker_id
        results = [
            ReportedResult(job_id=job.job_id, lease_token=job.lease_token, result=result)
            for job, result in items
        ]

        def on_retry(attempt: int, exc: BaseException, wait_s: float) -> None:
            if self._throttle("report", time.monotonic()) or attempt == 1:
                self.log.warning(
                    "report_retry",
                    jobs=len(items),
                    attempt=attempt,
                    retry_in_s=wait_s,
                    msg=str(exc),
                )

        leased: list[JobLease] = []
        # The lease's id, the same for every retry (as `_lease`'s).
        request_id, tries = new_request_id(), 0

        def post_all() -> list[Any]:
            nonlocal tries
            tries += 1
            acks = []
            for i in range(0, len(results), MAX_RESULTS_PER_POST):
                last = i + MAX_RESULTS_PER_POST >= len(results)
                jobs: list[JobLease] = []
                try:
                    answer = api.post_results_and_lease(
                        worker_id,
                        results[i : i + MAX_RESULTS_PER_POST],
                        max_jobs=self._lease_with_report(len(items)) if last and lease else 0,
                        # A retry looks for what a lost answer leased even where it asks
                        # for no new jobs (a worker that will register again first).
                        request_id=request_id if last else None,
                        retry=tries > 1,
                    )
                    jobs = answer.jobs
                finally:
                    # Held before the reported ones are released, and the reservation
                    # given back in the same lock, whatever became of the request.
                    with self._slots:
                        self._report_asking = 0
                        if jobs:
                            self._hold(jobs)
                        self._slots.notify_all()
                acks += answer.acks
                leased.extend(jobs)
            return acks

        try:
            acks = self._through_outage(post_all, on_retry)
        except TRANSIENT_REGISTERED as exc:
            for job, _ in items:
                self._count("unreported")
                self.log.error("report_gave_up", job=job.job_id, msg=str(exc))
            self._given_up(items)
            return
        finally:
            if leased:  # whatever became of the report, these jobs are the worker's
                self.log.event("leased", "debug", jobs=len(leased), with_report=True)
                self._count("leased_with_reports", len(leased))
                self._hand_over(leased, api)
        for item, ack in zip(items, acks, strict=True):
            job = item[0]
            if ack.status_code != 200:
                self._count("refused")
                self.log.error(
                    "report_refused", job=job.job_id, status=ack.status_code, msg=ack.detail
                )
            else:
                if ack.accepted:
                    self._delivered(item)
                self._acknowledged(job, ack.accepted, ack.job_state, ack.detail)

    def _report(
        self, api: WorkerApi, job: JobLease, result: MeasureResult, refusable: bool = True
    ) -> None:
        """Report one result. One the service refuses as invalid (400, 422) is reported
        again, once, as a failed trial saying why (`refusable`: not that one again)."""
        assert self.worker_id is not None
        body = JobResult(worker_id=self.worker_id, lease_token=job.lease_token, result=result)

        def on_retry(attempt: int, exc: BaseException, wait_s: float) -> None:
            if self._throttle(f"report-{job.job_id}", time.monotonic()) or attempt == 1:
                self.log.warning(
                    "report_retry", job=job.job_id, attempt=attempt, retry_in_s=wait_s, msg=str(exc)
                )

        try:
            ack = self._through_outage(lambda: api.post_result(job.job_id, body), on_retry)
        except TRANSIENT_REGISTERED as exc:
            self._count("unreported")
            self.log.error("report_gave_up", job=job.job_id, msg=str(exc))
            self._given_up([(job, result)])
            return
        except ApiError as exc:
            self._count("refused")
            self.log.error("report_refused", job=job.job_id, status=exc.status_code, msg=exc.reason)
            if not isinstance(exc, InvalidRequestError):
                return
            if _unknown_field(exc):
                # Not a judgement of the measurement: a service older than this worker (the
                # README: upgrade the service first). Left to its lease, the job is measured
                # again, and recorded once the service is upgraded, not failed now.
                self.log.warning(
                    "result_field_unknown",
                    job=job.job_id,
                    msg=f"the service does not know {exc.field!r}: upgrade it",
                )
            elif refusable:
                self._report(api, job, self._refused_result(result, exc), refusable=False)
            return
        if ack.accepted:
            self._delivered((job, result))
        self._acknowledged(job, ack.accepted, ack.job_state, ack.detail)

    def _refused_result(self, result: MeasureResult, exc: InvalidRequestError) -> MeasureResult:
        """The failed trial reported in place of a result the service refused as invalid (a
        runner's answer it cannot store): the job ends, failed with the reason, and the lease
        with it. Dropped, it stayed leased until its TTL ran out, was leased again (to this
        worker, as often as not), measured and refused again, and recorded `lost` after
        max_attempts TTLs, the reason nowhere. Handed back instead (a release, no attempt
        counted), it came straight back to be measured and refused, without end."""
        measured = result.status
        if result.latency_us is not None:
            measured += f", {result.latency_us:g} us"
        return self._failure(
            f"worker: the service refused the result measured ({measured}): {exc.reason}"
        )

    def _acknowledged(self, job: JobLease, accepted: bool, job_state: Any, detail: Any) -> None:
        if accepted:
            self._count("accepted")
            with self._slots:  # (recorded: its task is live)
                self._task_heard[job.task_id] = time.monotonic()
                self._slots.notify_all()
        else:
            # The lease expired and the job went to another worker, or the task was
            # cancelled: the service keeps the other answer, which is fine.
            self._count("stale")
            self.log.warning("result_not_accepted", job=job.job_id, job_state=job_state, msg=detail)
            if job_state == JobState.CANCELLED:
                # Its task's other jobs held ahead are cancelled too: not measured.
                with self._slots:
                    self._gone |= {k for k, t in self._task_of.items() if t == job.task_id}

    # ---- heartbeat ----------------------------------------------------------------------

    def _heartbeat(self, stop: Doorbell | threading.Event) -> None:
        api = self._api_factory()
        last_active: bool | None = None  # what the last heartbeat the service took said
        wakeups = 0  # since then
        try:
            while not stop.wait(self._heartbeat_interval_s()):
                # A measuring thread's ask (_await_word_of_task): a heartbeat now, due or not.
                with self._slots:
                    asked, self._beat_asked = self._beat_asked, False
                try:
                    if self.worker_id is None:
                        continue
                    wakeups += 1
                    now = time.monotonic()
                    with self._slots:
                        held = dict(self._held)
                        busy = max(self._busy, 0)
                    active = bool(held) or busy > 0
                    interval = self._heartbeat_interval_s()
                    expiring = any(term.due(now, interval) for term in held.values())
                    every = idle_every(interval, self._service_ttl_s)
                    if not asked and not heartbeat_due(
                        active, last_active, wakeups, expiring, every
                    ):
                        continue
                    if self._beat(api, held, busy, now):
                        last_active, wakeups = active, 0
                finally:
                    if asked:
                        with self._slots:
                            self._asked_beats += 1
                            self._slots.notify_all()
        finally:
            api.close()

    def _beat(self, api: WorkerApi, held: dict[LeaseKey, HeldTerm], busy: int, now: float) -> bool:
        """Send one heartbeat listing the leases `held` (as of `now`) and take its answer;
        whether the service took it (a failure is said here; the next may get through)."""
        assert self.worker_id is not None
        leases = None  # (more than a heartbeat lists: all are extended)
        if self._heartbeat_lists_leases and len(held) <= MAX_HELD_LEASES:
            leases = [HeldLease(job_id=j, lease_token=t) for j, t in held]
        try:
            ack = api.heartbeat(self.worker_id, busy_jobs=busy, leases=leases)
        except InvalidRequestError as exc:
            if leases is not None and exc.field == "leases":
                # A service from before heartbeats listed leases: as it takes them.
                self._heartbeat_lists_leases = False
                self.log.info("heartbeat_leases_unsupported", msg="all leases extended")
            elif self._throttle("heartbeat", time.monotonic()):
                self.log.warning("heartbeat_failed", msg=f"{type(exc).__name__}: {exc}")
            return False
        except Exception as exc:  # keep beating: the next one may get through
            self._heartbeats_failing = True
            if isinstance(exc, TRANSIENT_REGISTERED):
                self._reregister.set()
            if self._throttle("heartbeat", time.monotonic()):
                self.log.warning("heartbeat_failed", msg=f"{type(exc).__name__}: {exc}")
            return False
        gone = set(getattr(ack, "gone", None) or ())
        with self._slots:
            # The service names jobs: gone is the lease listed for each (one a job, _hold),
            # and only while still held: a job released meanwhile is not, nor one leased again
            # since (its new lease is another key).
            self._gone |= {key for key in held if key[0] in gone and key in self._held}
            if leases is not None:  # (the others' tasks are live: _await_word_of_task)
                for key in held:
                    if key[0] not in gone and key in self._task_of:
                        self._task_heard[self._task_of[key]] = now
            self._slots.notify_all()
        for term in held.values():
            term.extended(now)
        self._heartbeats_failing = False
        return True
