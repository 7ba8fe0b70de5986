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
