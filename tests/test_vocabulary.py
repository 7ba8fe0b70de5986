"""One vocabulary: the states, the knobs, the runner names and the operator names are each
defined once (model/), and everything else, the API schema included, derives from them."""

from __future__ import annotations

import dataclasses

import pytest
from service_support import client_for

from pipetune.model.family import OP_MAX_CHARS, all_ops, families, family
from pipetune.model.space import KNOB_DECLARATION, KNOB_NAMES, KNOB_SPECS, KNOBS, Schedule
from pipetune.model.states import (
    ACTIVE_TASK_STATES,
    FINAL_TASK_STATES,
    OUTSTANDING_JOB_STATES,
    TRIAL_JOB_STATES,
    JobState,
    TaskState,
)
from pipetune.model.trials import RunnerKind, is_simulated
from pipetune.model.wire import ScheduleDoc, TaskDoc
from pipetune.service.orm import WorkloadRow
from pipetune.workers.codegen import generate
from pipetune.workers.daemon import RUNNERS
from pipetune.workers.runners import RUNNER_NAMES


def test_final_states_follow_optunas_is_finished():
    # On the wire each state is its member's name in lower case (model/states.py is the one
    # place the code spells the strings).
    assert all(s.value == s.name.lower() for s in (*TaskState, *JobState))
    assert [s.name for s in TaskState if s.is_final()] == ["DONE", "FAILED", "CANCELLED"]
    assert [s.name for s in ACTIVE_TASK_STATES] == ["QUEUED", "RUNNING"]
    assert tuple(s for s in TaskState if s.is_final()) == FINAL_TASK_STATES
    assert [s.name for s in JobState if s.is_final()] == ["DONE", "FAILED", "LOST", "CANCELLED"]
    assert [s.name for s in OUTSTANDING_JOB_STATES] == ["QUEUED", "LEASED"]
    # A trial of the budget: a result or a job given up as lost, never a cancelled one.
    assert [s.name for s in TRIAL_JOB_STATES] == ["DONE", "FAILED", "LOST"]
    assert [s.name for s in JobState if s.has_result()] == ["DONE", "FAILED"]


def test_states_are_their_wire_strings():
    assert JobState("lost") is JobState.LOST and f"{TaskState.DONE}" == "done"
    doc = TaskDoc.model_validate(
        {
            "id": 1,
            "state": "running",
            "workload": {},
            "gpu": "h100",
            "strategy": "random",
            "budget": 1,
            "seed": 0,
            "trials_done": 0,
            "trials_failed": 0,
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
    )
    assert doc.state is TaskState.RUNNING and not doc.state.is_final()
    assert doc.model_dump(mode="json")["state"] == "running"


def test_the_knobs_are_declared_once():
    # One declaration (model/knobs.py Knob), read by the schedule type, the family and the
    # wire's schedule document, which takes exactly one family's knobs.
    assert tuple(f.name for f in dataclasses.fields(Schedule)) == KNOB_NAMES
    assert tuple(k.name for k in KNOB_DECLARATION) == KNOB_NAMES
    assert family("tensor_gemm").knobs is KNOB_DECLARATION
    assert {name: spec.values for name, spec in KNOB_SPECS.items()} == KNOBS
    assert KNOBS["smem_stages"] == (1, 2, 3, 4, 5, 6) and KNOBS["reg_stages"] == (1, 2)
    doc = ScheduleDoc(**Schedule(2, 2, 2, 2, 2, 3, 2).as_dict())
    assert doc.family.name == "tensor_gemm" and tuple(doc.model_dump()) == KNOB_NAMES
    assert doc.to_schedule() == Schedule(2, 2, 2, 2, 2, 3, 2)


def test_the_code_generator_checks_the_declared_domains():
    bad = Schedule(2, 2, 2, 2, 3, 3, 2)  # chunk 3 is outside (1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"chunk must be one of \[1, 2, 4, 8\], got 3"):
        generate("gemm_kn", bad)
    with pytest.raises(ValueError, match=r"chunk must be one of \[1, 2, 4, 8\], got 3"):
        Schedule.from_dict(dataclasses.asdict(bad))


def test_runner_names_live_with_the_result_a_runner_returns():
    assert RUNNER_NAMES == RUNNERS == ("cupy", "replay", "simulated")
    assert RunnerKind.of("replay:cupy") is RunnerKind.REPLAY
    assert RunnerKind.of("simulated") is RunnerKind.SIMULATED
    assert RunnerKind.of("abacus") is None and RunnerKind.of(None) is None
    assert [k.adjective for k in RunnerKind] == ["measured", "replayed", "simulated"]
    # Simulated at any depth of replay: shown as such, and never a learned prior's teacher.
    assert is_simulated("simulated") and is_simulated("replay:simulated")
    assert not any(map(is_simulated, ["cupy", "replay:cupy", None, ""]))


def test_the_api_schema_derives_its_enums(tmp_path):
    from pipetune.service.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'schema.db'}"
    upgrade(url)
    with client_for(url) as client:
        spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]

    def enum(schema: dict) -> list:
        if "$ref" in schema:
            return enum(schemas[schema["$ref"].rsplit("/", 1)[1]])
        if "anyOf" in schema:
            return [v for s in schema["anyOf"] for v in enum(s)]
        return schema.get("enum", [])

    assert enum(schemas["TaskDoc"]["properties"]["state"]) == [s.value for s in TaskState]
    assert enum(schemas["TrialDoc"]["properties"]["state"]) == [s.value for s in JobState]
    assert enum(schemas["WorkerRegister"]["properties"]["runner"]) == list(RUNNER_NAMES)
    knobs = schemas["ScheduleDoc"]["properties"]
    every = {k.name: k.values for fam in families() for k in fam.knobs}
    assert {name: tuple(p["enum"]) for name, p in knobs.items()} == every
    assert {name: every[name] for name in KNOBS} == KNOBS
    assert knobs["chunk"]["description"] == KNOB_SPECS["chunk"].doc
    curves = spec["paths"]["/v1/curves"]["get"]["parameters"]
    (op,) = [p for p in curves if p["name"] == "op"]
    assert enum(op["schema"]) == list(all_ops())
    tasks = spec["paths"]["/v1/tasks"]["get"]["parameters"]
    (state,) = [p for p in tasks if p["name"] == "state"]
    assert enum(state["schema"]) == [s.value for s in TaskState]


def test_every_op_name_fits_the_workloads_column():
    """PostgreSQL refuses a value longer than its VARCHAR (SQLite keeps it): an op name
    longer than the column made every task of that op a 500 on PostgreSQL only."""
    assert WorkloadRow.__table__.c.op.type.length == OP_MAX_CHARS
    assert max(map(len, all_ops())) <= OP_MAX_CHARS
