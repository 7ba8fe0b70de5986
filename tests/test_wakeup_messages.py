"""The NOTIFY messages between replicas (service/wakeup.py): a job signal wakes waiting
lease requests; an advance request reaches the proposer of the replica holding the task."""

from __future__ import annotations

import json

from pipetune.service.wakeup import Wakeup


def test_an_advance_request_from_another_replica_reaches_the_hook_and_nothing_else():
    here, there = Wakeup(shared=True), Wakeup(shared=True)
    asked: list[int] = []
    here.on_advance = asked.append
    generation = here.generation
    here.deliver(there.advance_payload(42))
    assert asked == [42]
    assert here.generation == generation  # not a job signal: no memory of the queue is lost
    here.deliver(here.advance_payload(7))  # its own message: the listener skips it
    assert asked == [42]


def test_job_signals_still_bump_and_malformed_messages_are_ignored():
    here, there = Wakeup(shared=True), Wakeup(shared=True)
    asked: list[int] = []
    here.on_advance = asked.append
    generation = here.generation
    here.deliver(there.payload("sm_90", "h100", 3))
    assert here.generation > generation and asked == []
    for bad in ("{", json.dumps({"origin": "x", "advance": "seven"}), json.dumps([1])):
        here.deliver(bad)  # logged and dropped, never raised into the listener
    assert asked == []
    no_hook = Wakeup(shared=True)
    no_hook.deliver(there.advance_payload(1))  # a replica without a proposer ignores it


def test_no_message_anyone_may_notify_stops_the_listener():
    """A message is anything sent on the channel (`NOTIFY pipetune_jobs` from any session
    of the database). A number too large for an integer (1e999, JSON's infinity) or nesting
    too deep to parse raised out of `deliver` (OverflowError, RecursionError), and the
    listener's thread died: every replica then heard no other for good (a lease woken by
    another replica's jobs waited out its whole wait, measured)."""
    here = Wakeup(shared=True)
    asked: list[int] = []
    here.on_advance = asked.append
    generation = here.generation
    for bad in (
        json.dumps({"origin": "x", "arch": "sm_90", "gpu": "h100", "count": 1e999}),
        '{"origin": "x", "advance": 1e999}',
        "[" * 3990 + "]" * 3990,  # (a NOTIFY payload is under 8000 bytes)
    ):
        here.deliver(bad)  # logged and dropped
    assert asked == [] and here.generation == generation


def test_a_signal_for_one_runners_jobs_wakes_that_runners_workers_only():
    """A cupy-only task's jobs woke the first waiting requests of the arch and GPU: eight
    simulated workers took the signal's count, found nothing, and the GPU worker waited for
    the fallback poll (4.5 s a batch, measured). The runner travels with the signal, across
    replicas too, and a signal for any runner still wakes them all."""
    import asyncio

    from pipetune.service.wakeup import WorkerKind

    simulated = WorkerKind("sm_90", "h100", None, "simulated")
    gpu = WorkerKind("sm_90", "h100", None, "cupy")
    assert gpu.takes("sm_90", "h100", "cupy") and not simulated.takes("sm_90", "h100", "cupy")
    assert gpu.takes("sm_90", "h100") and simulated.takes("sm_90", "h100")
    # Not another GPU's jobs, although the arch is the same.
    assert not gpu.takes("sm_90", "h200", "cupy") and not simulated.takes("sm_90", "h200")

    async def woken(message: str) -> list[bool]:
        here, there = Wakeup(shared=True), Wakeup(shared=True)
        here.attach(asyncio.get_running_loop())
        waits = [here.wait(kind, 2.0) for kind in (*[simulated] * 8, gpu)]
        tasks = [asyncio.ensure_future(w) for w in waits]
        await asyncio.sleep(0.05)
        here.deliver(message.replace("ORIGIN", there.origin))
        return list(await asyncio.gather(*tasks))

    one_cupy_job = json.dumps(
        {"origin": "ORIGIN", "arch": "sm_90", "gpu": "h100", "count": 1, "runner": "cupy"}
    )
    assert asyncio.run(woken(one_cupy_job)) == [False] * 8 + [True]
    nine_any = json.dumps({"origin": "ORIGIN", "arch": "sm_90", "gpu": "h100", "count": 9})
    assert asyncio.run(woken(nine_any)) == [True] * 9


def test_a_bound_worker_woken_first_leaves_the_signal_to_the_others():
    """A replay worker bound to one workload, waiting first, took a one-job signal that was
    another workload's: its claim found nothing, and the unbound worker behind it got the job
    only at the fallback poll (4.5 s, measured with two replicas)."""
    import asyncio

    from pipetune.service.wakeup import WorkerKind

    bound = WorkerKind("sm_90", "h100", "workload-a", "replay")
    unbound = WorkerKind("sm_90", "h100", None, "replay")
    other = WorkerKind("sm_90", "h100", None, "replay")

    async def woken() -> list[bool]:
        here, there = Wakeup(shared=True), Wakeup(shared=True)
        here.attach(asyncio.get_running_loop())
        tasks = [asyncio.ensure_future(here.wait(k, 1.0)) for k in (bound, unbound, other)]
        await asyncio.sleep(0.05)
        here.deliver(there.payload("sm_90", "h100", 1, "replay"))
        return list(await asyncio.gather(*tasks))

    # The bound one may claim it (it may be its workload's) and so does the first unbound
    # one; the second unbound one is not woken for a single job.
    assert asyncio.run(woken()) == [True, True, False]


def test_a_woken_request_knows_how_many_of_the_signals_jobs_no_other_was_woken_for():
    """What a request that leaves before it claims passes on (Queue.lease): the jobs it used
    up of the signal, no more (it passed on all it asked for, and woke requests for jobs
    that were never announced), and none for a bound worker, which uses up none."""
    import asyncio

    from pipetune.service.wakeup import WorkerKind

    bound = WorkerKind("sm_90", "h100", "workload-a", "replay")
    unbound = WorkerKind("sm_90", "h100", None, "replay")

    async def counts() -> list[int | None]:
        here = Wakeup(shared=False)
        here.attach(asyncio.get_running_loop())
        asks = [(bound, 4), (unbound, 2), (unbound, 2), (unbound, 1)]
        tasks = [asyncio.ensure_future(here.woken(k, 1.0, n)) for k, n in asks]
        await asyncio.sleep(0.05)
        here.signal("sm_90", "h100", 3, "replay")
        return [None if w is None else w.count for w in await asyncio.gather(*tasks)]

    assert asyncio.run(counts()) == [0, 2, 1, None]


def test_memories_of_an_empty_queue_stay_bounded(monkeypatch):
    """One memory per kind of worker ever seen (bound replay workers: one per workload) was
    kept for good; only the current generation's can be trusted, and a full set is cleared."""
    from pipetune.service import wakeup as module
    from pipetune.service.wakeup import WorkerKind

    monkeypatch.setattr(module, "MAX_EMPTY_KINDS", 8)
    here = Wakeup(shared=False)
    for i in range(100):
        if i % 3 == 0:
            here.bump()  # a signal: earlier memories are stale
        here.found_empty(WorkerKind("sm_90", "h100", f"workload-{i}", "replay"), here.generation)
        assert len(here._empty) <= 8
    last = WorkerKind("sm_90", "h100", "workload-99", "replay")
    assert here.known_empty(last, fresh_s=60)  # the newest memory is kept and trusted


def test_a_signal_with_jobs_left_for_nobody_waiting_is_remembered_for_its_kind():
    """What a lease request claiming off the event loop (not waiting) looks at before it
    waits (Queue.lease): jobs announced meanwhile that no waiting request was woken for."""
    import asyncio

    from pipetune.service.wakeup import WorkerKind

    simulated = WorkerKind("sm_90", "h100", None, "simulated")

    async def run() -> None:
        here = Wakeup(shared=False)
        here.attach(asyncio.get_running_loop())
        mark = here.wakes
        here.signal("sm_90", "h200", 2)  # another GPU's
        here.signal("sm_90", "h100", 2, "cupy")  # another runner's
        await asyncio.sleep(0.01)
        assert not here.missed(simulated, mark)
        # One waiting request asks for both jobs: nothing is left over.
        waiting = asyncio.ensure_future(here.wait(simulated, 2.0, wants=2))
        await asyncio.sleep(0.01)
        mark = here.wakes
        here.signal("sm_90", "h100", 2)
        assert await waiting and not here.missed(simulated, mark)
        here.signal("sm_90", "h100", 2)  # nobody waits now
        await asyncio.sleep(0.01)
        assert here.missed(simulated, mark) and not here.missed(simulated, here.wakes)

    asyncio.run(run())
