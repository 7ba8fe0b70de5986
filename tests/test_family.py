"""Kernel families: one registry, one interface, and the GEMM family expressed through it
without a change in any space, prediction or ranking."""

from __future__ import annotations

import numpy as np
import pytest

from pipetune.model import family as families
from pipetune.model.analytical import evaluate as alcop_evaluate
from pipetune.model.analytical import rank as alcop_rank
from pipetune.model.family import (
    FamilyPrediction,
    FamilySchedule,
    FamilySpace,
    KernelFamily,
    Knob,
    family,
    family_for_op,
    family_of,
    parse_any_workload,
)
from pipetune.model.memops.workloads import MEM_OPS, softmax
from pipetune.model.space import KNOBS, Space
from pipetune.model.workloads import OPS, WorkloadError, gemm
from pipetune.workers.families import codegen_for, reference_for


def test_registry_holds_both_families_and_every_op_once():
    assert set(families.family_names()) >= {"tensor_gemm", "memops"}
    owners = families.op_families()
    assert {op: f.name for op, f in owners.items() if op in OPS} == dict.fromkeys(
        OPS, "tensor_gemm"
    )
    assert {op: f.name for op, f in owners.items() if op in MEM_OPS} == dict.fromkeys(
        MEM_OPS, "memops"
    )
    for fam in families.families():
        assert isinstance(fam, KernelFamily)
        assert fam.work_unit in ("flop", "byte")


def test_ops_dispatch_and_unknown_ops_name_every_known_one():
    assert family_for_op("softmax").name == "memops"
    assert family_for_op("conv2d").name == "tensor_gemm"
    w = parse_any_workload({"op": "layernorm", "rows": 8, "cols": 16})
    assert family_of(w).name == "memops"
    with pytest.raises(WorkloadError) as info:
        parse_any_workload({"op": "transpose", "rows": 8, "cols": 8})
    assert info.value.field == "op"
    assert "gemm" in info.value.reason and "softmax" in info.value.reason
    with pytest.raises(WorkloadError):
        family_for_op({"op": 1})
    with pytest.raises(families.FamilyError):
        family("chimera")


def test_registration_refuses_a_second_owner_of_a_name():
    with pytest.raises(ValueError, match="already registered"):
        families.register("memops", "somewhere.else:FAMILY")


def test_knob_declarations_are_ascending_and_match_the_gemm_space():
    gemm_family = family("tensor_gemm")
    assert {k.name: k.values for k in gemm_family.knobs} == {k: tuple(v) for k, v in KNOBS.items()}
    for fam in families.families():
        for knob in fam.knobs:
            assert list(knob.values) == sorted(set(knob.values))
    with pytest.raises(ValueError):
        Knob("bad", (2, 1), True, "descending")


def test_gemm_through_the_interface_is_unchanged(h100):
    w = gemm(1024, 64, 2048)
    fam = family_of(w)
    space = fam.enumerate(w, h100)
    direct = Space.enumerate(w, h100)
    assert space.ids == direct.ids
    np.testing.assert_array_equal(fam.evaluate(space).T_kernel, alcop_evaluate(direct).T_kernel)
    _, _, ranked = fam.rank(w, h100, top=20)
    _, _, expected = alcop_rank(w, h100, top=20)
    assert [r.schedule_id for r in ranked] == [r.schedule_id for r in expected]
    assert [r.terms for r in ranked] == [r.terms for r in expected]
    label, mask = fam.baseline(space)
    assert label == "non-pipelined" and mask.any() and not mask.all()
    schedule = fam.parse_schedule(space[0].as_dict())
    assert schedule == space[0] and fam.schedule_problems(schedule, w, h100) == []


@pytest.mark.parametrize("workload", [gemm(1024, 768, 768), softmax(4096, 768)])
def test_each_family_gives_what_the_tuner_needs(h100, workload):
    """A space, its features, its model's predictions and knob-dict schedules: the whole
    contract the tuner, the cost model and the service will see in phase 2."""
    fam = family_of(workload)
    space = fam.enumerate(workload, h100)
    assert isinstance(space, FamilySpace)
    assert isinstance(space[0], FamilySchedule)
    prediction = fam.evaluate(space)
    assert isinstance(prediction, FamilyPrediction)
    assert prediction.T_kernel.shape == (len(space),)
    x = space.features()
    assert x.shape == (len(space), len(space.feature_names)) and np.isfinite(x).all()
    names, model_x = fam.model_features(space)
    assert model_x.shape == (len(space), len(names)) and np.isfinite(model_x).all()
    # One column per quantity: the cost model's table is the schedule's features + these.
    assert not set(names) & set(space.feature_names)
    throughput = fam.throughput(space, prediction.T_kernel)
    assert (throughput > 0).all()
    doc = space[5].as_dict()
    assert set(doc) == set(fam.knob_names) and all(type(v) is int for v in doc.values())
    assert fam.parse_schedule(doc) == space[5]
    assert space.cache_key[0] == workload.workload_hash


@pytest.mark.parametrize(
    "workload",
    [
        gemm(1024, 768, 768),
        softmax(4096, 768),
        {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 768},
    ],
    ids=["tensor_gemm", "memops", "hopper_gemm"],
)
def test_every_schedule_id_reads_back_as_its_schedule_in_its_family_only(h100, workload):
    """Ids are what tables and exports show, and what users give back: each family reads
    its own, and no other family reads it."""
    from pipetune.model.family import families as all_families
    from pipetune.model.family import parse_any_workload, schedule_of_id

    w = parse_any_workload(workload) if isinstance(workload, dict) else workload
    fam = family_of(w)
    space = fam.enumerate(w, h100)
    for schedule in space:
        assert fam.parse_schedule_id(schedule.id) == schedule
        assert schedule_of_id(schedule.id) == schedule
    others = [f for f in all_families() if f.name != fam.name]
    assert all(f.parse_schedule_id(space[0].id) is None for f in others)
    assert fam.parse_schedule_id(space[0].id + "-1") is None
    assert fam.parse_schedule_id(space[0].id[:-1] + "x") is None


def test_workers_resolve_each_familys_generator_and_reference():
    mem_codegen = codegen_for("memops")
    assert mem_codegen.__name__ == "pipetune.workers.codegen.memops"
    assert hasattr(mem_codegen, "generate") and hasattr(mem_codegen, "launch_plan")
    assert reference_for("memops").__name__ == "pipetune.workers.runners.memops_reference"
    assert hasattr(codegen_for("tensor_gemm"), "generate")
    reference = reference_for(family("tensor_gemm"))
    assert hasattr(reference, "reference") and hasattr(reference, "check")


@pytest.mark.parametrize(
    "schedule_type",
    [
        "pipetune.model.space:Schedule",
        "pipetune.model.hopper.space:HopperSchedule",
        "pipetune.model.memops.space:MemSchedule",
    ],
)
def test_a_schedules_knob_dict_is_dataclasses_asdict_in_declaration_order(schedule_type):
    """`as_dict` reads the fields directly (dataclasses.asdict deep-copies, 18x slower): the
    same dict, in the same order, as asdict gives and as the declaration names the knobs."""
    import dataclasses
    import importlib

    module, name = schedule_type.split(":")
    cls = getattr(importlib.import_module(module), name)
    fields = dataclasses.fields(cls)
    schedule = cls(**{f.name: 2**i for i, f in enumerate(fields)})
    doc = schedule.as_dict()
    assert list(doc.items()) == list(dataclasses.asdict(schedule).items())
    assert list(doc) == [k.name for k in cls.declaration]


@pytest.mark.parametrize(
    ("threads", "smem", "registers", "model", "driver"),
    [
        (32, 0, 85, 23, 20),  # one warp: 5 per sub-partition's 16,384 registers, not 23/4
        (64, 0, 40, 25, 24),  # two warps of 1,280 registers each
        (256, 8208, 32, 8, 8),  # no difference where threads bind
        (32, 8208, 16, 25, 24),  # 8,208 + 1,024 reserved rounds up to 9,344 bytes
    ],
)
def test_occupancy_by_the_drivers_rules(threads, smem, registers, model, driver):
    """`cuda_rules`: blocks per SM as cudaOccupancy.h counts them (registers per
    sub-partition, shared memory in 128-byte units), never more than the model's count."""
    from pipetune.model.hardware import get_gpu
    from pipetune.model.occupancy import blocks_per_sm

    h100 = get_gpu("h100")
    assert int(blocks_per_sm(h100, threads, smem, registers)) == model
    assert int(blocks_per_sm(h100, threads, smem, registers, cuda_rules=True)) == driver
