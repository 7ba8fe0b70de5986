"""Launch plans with pointers after the scalars and TMA tensor maps (the Hopper wgmma
kernels' run: `(A, B, C, M, N, K, tiles, tmap_a, tmap_b, W, arrivals)`), without a GPU: the
plan's parameter order, the cupy runner's child on the numpy stand-in for CuPy
(tests/fake_cupy.py), its simulated twin, and pipetune.kernel's call with the driver's calls
recorded instead of made. The encoder itself (cuTensorMapEncodeTiled) needs a driver and is
replaced by one that records what it was asked."""

from __future__ import annotations

import ctypes
import sys
import types
from dataclasses import replace
from typing import Any

import fake_cupy
import numpy as np
import pytest
from test_kernel_callable import FC, TWO_PASS, S, StandIn, arrays

import pipetune
from pipetune.clients.library import cuda_launch
from pipetune.clients.library import kernel as kernel_module
from pipetune.clients.library.cuda_launch import KernelParams
from pipetune.model.workloads import gemm
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan, TensorMap
from pipetune.workers.runners import cupy_child, sim_child, tensor_maps
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.timing import RepeatPolicy

TRAILING = ("tmap_a", "tmap_b", "W", "arrivals")
PARAMETERS = [
    ("A", "buffer"),
    ("B", "buffer"),
    ("C", "buffer"),
    ("M", "int32"),
    ("N", "int32"),
    ("K", "int32"),
    ("tiles", "int32"),
    *((name, "buffer") for name in TRAILING),
]


def stream_k_launch(kernel: str = "wg", m: int = 64, n: int = 32, k: int = 48) -> KernelLaunch:
    """The stream-K kernel's launch: the tile count after the sizes, then the two tensor
    maps, the partial tiles and the arrival counters."""
    return KernelLaunch(
        kernel,
        (4, 1, 1),
        (128, 1, 1),
        1024,
        ("A", "B", "C", "M", "N", "K", "tiles", *TRAILING),
        {"M": m, "N": n, "K": k, "tiles": 2},
        trailing=TRAILING,
    )


def stream_k_plan(launch: KernelLaunch, m: int, n: int, k: int) -> LaunchPlan:
    buffers = (
        Buffer("A", (m, k), "float16", "input"),
        Buffer("B", (k, n), "float16", "input"),
        Buffer("C", (m, n), "float16", "output"),
        Buffer("W", (2 * 4 * 64 * 64,), "float32", "workspace"),
        Buffer("arrivals", (2,), "float32", "workspace"),
    )
    maps = (
        TensorMap("tmap_a", "A", (k, m, 1), (k * 2, m * k * 2), (64, 64, 1)),
        TensorMap("tmap_b", "B", (n, k, 1), (n * 2, k * n * 2), (64, 64, 1)),
    )
    return LaunchPlan(buffers, (launch,), output="C", tensor_maps=maps)


def recording_encoder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """encode_tensor_map replaced: (map name, operand address) per call, and bytes that say
    which map they encode (its name's first letter after "tmap_", 128 times)."""
    encoded: list[tuple[str, int]] = []

    def encode(spec: TensorMap, address: int) -> bytes:
        encoded.append((spec.name, address))
        return map_bytes(spec.name)

    monkeypatch.setattr(tensor_maps, "encode_tensor_map", encode)
    return encoded


def map_bytes(name: str) -> bytes:
    return name.removeprefix("tmap_").encode() * tensor_maps.TENSOR_MAP_BYTES


# ---- the plan ------------------------------------------------------------------------------


def test_trailing_pointers_come_after_the_scalars():
    launch = stream_k_launch()
    assert launch.parameters() == PARAMETERS
    assert launch.buffer_arguments == ("A", "B", "C")
    assert launch.scalar_arguments == ("M", "N", "K", "tiles")
    assert launch.trailing_arguments == TRAILING
    assert launch.pointer_arguments == ("A", "B", "C", *TRAILING)
    assert launch.as_dict()["trailing"] == list(TRAILING)
    assert launch.as_dict()["arguments"] == [name for name, _ in PARAMETERS]


def test_a_scalar_named_as_a_buffer_is_placed_by_position_with_trailing_pointers():
    # A convolution's channel count C beside its output C: the middle C is the scalar.
    launch = KernelLaunch("k", (1, 1, 1), (32, 1, 1), 0, ("x", "C", "C", "ws"), {"C": 3}, ("ws",))
    assert launch.parameters() == [
        ("x", "buffer"),
        ("C", "buffer"),
        ("C", "int32"),
        ("ws", "buffer"),
    ]
    assert launch.pointer_arguments == ("x", "C", "ws")


def test_trailing_pointers_must_end_the_arguments():
    with pytest.raises(ValueError, match="must end with the trailing pointers"):
        KernelLaunch("k", (1, 1, 1), (32, 1, 1), 0, ("A", "t", "M"), {"M": 1}, trailing=("t",))
    with pytest.raises(ValueError, match="cannot hold 1 scalars and 2 trailing"):
        KernelLaunch("k", (1, 1, 1), (32, 1, 1), 0, ("t", "u"), {"M": 1}, trailing=("t", "u"))


def test_a_plan_without_trailing_pointers_or_tensor_maps_is_described_as_before():
    for workload, schedule in ((FC, S), ({"op": "layernorm", "rows": 512, "cols": 1024}, TWO_PASS)):
        plan = pipetune.kernel(workload, "h100", schedule=schedule).plan
        assert plan.tensor_maps == () and set(plan.as_dict()) == {"buffers", "launches", "output"}
        for launch in plan.launches:
            assert launch.trailing == () and launch.trailing_arguments == ()
            assert set(launch.as_dict()) == {
                "kernel", "grid", "block", "dynamic_smem_bytes", "arguments", "scalars",
            }  # fmt: skip
            # Every pointer leads, every scalar follows: the parameters as they always were.
            pointers = launch.arguments[: len(launch.arguments) - len(launch.scalars)]
            assert launch.pointer_arguments == launch.buffer_arguments == pointers
            assert [kind for _, kind in launch.parameters()] == ["buffer"] * len(pointers) + [
                "float32" if isinstance(launch.scalars[n], float) else "int32"
                for n in launch.arguments[len(pointers) :]
            ]


def test_a_plans_tensor_maps_are_named_and_described():
    plan = stream_k_plan(stream_k_launch(), 64, 32, 48)
    assert plan.tensor_map("tmap_b").operand == "B"
    with pytest.raises(KeyError):
        plan.tensor_map("W")  # a buffer, not a map
    assert plan.as_dict()["tensor_maps"][0] == {
        "name": "tmap_a",
        "operand": "A",
        "dims": [48, 64, 1],
        "strides": [96, 6144],
        "box": [64, 64, 1],
        "dtype": "float16",  # said for float16 too: code that encodes the maps reads it
    }
    with pytest.raises(ValueError, match="over D, not a buffer"):
        replace(plan, tensor_maps=(TensorMap("tmap_d", "D", (8,), (), (8,)),))
    with pytest.raises(ValueError, match="has a buffer's name"):
        replace(plan, tensor_maps=(TensorMap("W", "A", (8,), (), (8,)),))
    with pytest.raises(ValueError, match="the strides one fewer"):
        TensorMap("t", "A", (48, 64), (96, 6144), (64, 64))


# ---- the cupy runner's child ----------------------------------------------------------------

WORKLOAD = gemm(64, 32, 48)
POLICY = RepeatPolicy(warmup=1, min_repeats=5, max_repeats=10, settle=0.03)


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The numpy stand-in for CuPy, its arrays' addresses their numpy data pointers."""
    fake = fake_cupy.make()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cupy_child, "MIN_FLUSH_BYTES", 1 << 16)
    monkeypatch.setattr(cupy_child, "_device_address", lambda array: array.ctypes.data)
    cupy_child.init_device(0)
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    return fake


def trial(tmp_path: Any, behaviour: bytes) -> TrialSpec:
    path = tmp_path / "wg.cubin"
    path.write_bytes(behaviour + b"\n")
    m, n, k = WORKLOAD.m, WORKLOAD.n, WORKLOAD.k
    return TrialSpec(
        workload_hash=WORKLOAD.workload_hash,
        schedule_id="wg64x64s6_tma_st_sk",
        cubin_path=str(path),
        plan=stream_k_plan(stream_k_launch(m=m, n=n, k=k), m, n, k),
        policy=POLICY,
        model_us=10.0,
    )


def test_the_child_uploads_the_maps_and_passes_them_after_the_scalars(cupy, tmp_path, monkeypatch):
    encoded = recording_encoder(monkeypatch)
    seen: list[tuple] = []

    def stream_k_kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
        seen.append(args)
        a, b, c = args[:3]
        c[...] = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)

    monkeypatch.setitem(fake_cupy.KERNELS, b"stream-k", stream_k_kernel)
    answer = cupy_child.run_trial(trial(tmp_path, b"stream-k"))
    assert answer["status"] == "ok" and answer["verified"]
    inputs = cupy_child._STATE["workload"].inputs
    assert encoded == [("tmap_a", inputs["A"].ctypes.data), ("tmap_b", inputs["B"].ctypes.data)]
    args = seen[0]
    assert len(args) == 11 and args[0] is inputs["A"] and args[1] is inputs["B"]
    assert [type(s) for s in args[3:7]] == [np.int32] * 4
    assert [int(s) for s in args[3:7]] == [64, 32, 48, 2]
    assert [bytes(x) for x in args[7:9]] == [map_bytes("tmap_a"), map_bytes("tmap_b")]
    assert args[7].dtype == np.uint8
    assert (args[9].shape, args[9].dtype) == ((2 * 4 * 64 * 64,), np.float32)  # W
    assert (args[10].shape, args[10].dtype) == ((2,), np.float32)  # arrivals
    assert len(encoded) == 2  # encoded once per trial, not per timed launch
    assert all(later[7] is args[7] for later in seen)


def test_a_map_the_driver_refuses_is_a_launch_error_that_leaves_the_context_usable(
    cupy, tmp_path, monkeypatch
):
    def refuse(spec: TensorMap, address: int) -> bytes:
        raise RuntimeError("cuTensorMapEncodeTiled failed (CUresult 1)")

    monkeypatch.setattr(tensor_maps, "encode_tensor_map", refuse)
    answer = cupy_child.run_trial(trial(tmp_path, b"ok"))
    assert answer["status"] == "launch_error" and not answer["poisoned"]
    assert answer["error"] == "tensor map tmap_a: cuTensorMapEncodeTiled failed (CUresult 1)"
    assert cupy.state.launches == 0


def test_the_simulated_twin_takes_a_plan_with_tensor_maps(tmp_path):
    sim_child.init_device(0)
    sim_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = sim_child.run_trial(trial(tmp_path, b"ok"))
    assert answer["status"] == "ok" and answer["simulated"] and answer["samples_ms"]


# ---- pipetune.kernel's call ------------------------------------------------------------------


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The driver's calls recorded instead of made: loads, workspace allocations, uploads
    (with the bytes uploaded) and launches (with their pointers)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cuda_launch, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(cuda_launch, "max_shared_per_block", lambda device: 232_448)
    monkeypatch.setattr(cuda_launch, "load_function", lambda device, cubin, config: "function")

    def memory(kind: str, data: np.ndarray, stream: int) -> Any:
        calls.append({kind: data, "stream": stream})
        return types.SimpleNamespace(address=data.ctypes.data, keep=data)

    monkeypatch.setattr(
        cuda_launch,
        "allocate_zeroed",
        lambda device, nbytes, stream: memory("alloc", np.zeros(nbytes, np.uint8), stream),
    )
    monkeypatch.setattr(
        cuda_launch,
        "upload",
        lambda device, data, stream: memory("upload", np.frombuffer(data, np.uint8).copy(), stream),
    )

    def launch(device: int, function: Any, config: Any, pointers: list[int], stream: int) -> None:
        calls.append({"config": config, "pointers": pointers, "stream": stream})

    monkeypatch.setattr(cuda_launch, "launch", launch)
    return calls


def stream_k_kernel_object() -> Any:
    """FC's kernel with the stream-K kernel's plan (the wgmma family is not one of
    pipetune.kernel's yet): the same operands, two maps, two workspaces after the scalars."""
    k = pipetune.kernel(FC, "h100", schedule=S)
    m, n, kk = FC["m"], FC["n"], FC["k"]
    k.plan = stream_k_plan(stream_k_launch(k.name, m, n, kk), m, n, kk)
    return k


def of(calls: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in calls if kind in c]


def test_a_call_passes_the_uploaded_maps_after_the_scalars(driver, monkeypatch):
    encoded = recording_encoder(monkeypatch)
    k = stream_k_kernel_object()
    a, b, c = arrays(FC)
    assert k(a, b, c) is c
    address = {"A": a.host.ctypes.data, "B": b.host.ctypes.data, "C": c.host.ctypes.data}
    assert encoded == [("tmap_a", address["A"]), ("tmap_b", address["B"])]
    uploads, allocs = of(driver, "upload"), of(driver, "alloc")
    assert [bytes(u["upload"]) for u in uploads] == [map_bytes("tmap_a"), map_bytes("tmap_b")]
    assert [len(x["alloc"]) for x in allocs] == [2 * 4 * 64 * 64 * 4, 2 * 4]  # W, arrivals
    address |= {"tmap_a": uploads[0]["upload"].ctypes.data}
    address |= {"tmap_b": uploads[1]["upload"].ctypes.data}
    address |= {"W": allocs[0]["alloc"].ctypes.data, "arrivals": allocs[1]["alloc"].ctypes.data}
    (run,) = of(driver, "pointers")
    assert run["pointers"] == [address[n] for n in ("A", "B", "C", *TRAILING)]
    k(a, b, c)  # the same arrays: the maps already uploaded are passed again
    assert len(encoded) == 2 and len(of(driver, "upload")) == 2
    assert of(driver, "pointers")[-1]["pointers"] == run["pointers"]
    other = StandIn(np.zeros_like(a.host))
    k(other, b, c)  # another A: its own map, B's kept
    assert encoded[2:] == [("tmap_a", other.host.ctypes.data)]
    pointers = of(driver, "pointers")[-1]["pointers"]
    assert pointers[0] == other.host.ctypes.data
    assert pointers[3:5] == [of(driver, "upload")[-1]["upload"].ctypes.data, address["tmap_b"]]
    doc = k.launch_document()
    assert [tm["name"] for tm in doc["tensor_maps"]] == ["tmap_a", "tmap_b"]
    assert "then tmap_a (const void*), tmap_b (const void*), W (float*)" in doc["notes"][0]


def test_a_map_is_kept_per_stream_and_the_oldest_are_freed(driver, monkeypatch):
    encoded = recording_encoder(monkeypatch)
    monkeypatch.setattr(kernel_module, "TENSOR_MAP_CACHE", 2)
    k = stream_k_kernel_object()
    a, b, c = arrays(FC)
    k(a, b, c)
    monkeypatch.setattr(
        "pipetune.clients.library.frameworks.current_stream", lambda array, device: 0xBEEF
    )
    k(a, b, c)  # another stream: maps of its own (uploaded on it), the first stream's freed
    assert [u["stream"] for u in of(driver, "upload")] == [0, 0, 0xBEEF, 0xBEEF]
    assert len(k._tensor_maps) == 2
    monkeypatch.setattr(
        "pipetune.clients.library.frameworks.current_stream", lambda array, device: 0
    )
    k(a, b, c)  # stream 0's maps were freed: encoded again
    assert len(encoded) == 6


def test_kernel_params_put_the_trailing_pointers_after_the_scalars():
    launch = stream_k_launch()
    pointers = [0x1000 * (i + 1) for i in range(7)]
    params = KernelParams(launch, pointers)
    assert len(params.values) == 11  # (before reading the slots back through raw pointers)
    slots = (ctypes.c_void_p * 11).from_address(params.address)
    values = [ctypes.c_void_p.from_address(slots[i]).value for i in (0, 1, 2, 7, 8, 9, 10)]
    scalars = [ctypes.c_int32.from_address(slots[i]).value for i in range(3, 7)]
    assert values == pointers and scalars == [64, 32, 48, 2]
    with pytest.raises(ValueError, match=r"takes 7 pointers \(A, B, C, tmap_a"):
        KernelParams(launch, pointers[:3])


def test_upload_copies_the_bytes_on_the_callers_stream(monkeypatch):
    """cuda_launch.upload against a stand-in for the driver's bindings: device memory is a
    host buffer here, so the copy can be read back."""
    memory = np.zeros(256, np.uint8)
    copies: list[int] = []

    def copy(dst: int, src: int, nbytes: int, stream: int) -> tuple[int]:
        ctypes.memmove(dst, src, nbytes)
        copies.append(stream)
        return (0,)

    fake = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0),
        CUdeviceptr=int,
        CUstream=int,
        cuCtxPushCurrent=lambda context: (0,),
        cuCtxPopCurrent=lambda: (0, None),
        cuMemAlloc=lambda nbytes: (0, memory.ctypes.data),
        cuMemcpyHtoDAsync=copy,
    )
    monkeypatch.setattr(cuda_launch, "_driver", lambda: fake)
    monkeypatch.setattr(cuda_launch, "_primary_context", lambda device: "context")
    uploaded = cuda_launch.upload(0, map_bytes("tmap_a"), 0xBEEF)
    uploaded._finalizer.detach()  # the stand-in's memory is numpy's to free
    assert uploaded.address == memory.ctypes.data and copies == [0xBEEF]
    assert bytes(memory[:128]) == map_bytes("tmap_a") and not memory[128:].any()


def test_the_encoder_calls_the_drivers_signature_with_the_maps_values(monkeypatch):
    """encode_tensor_map through ctypes against a C-callable stand-in of the driver's
    cuTensorMapEncodeTiled (12 parameters): the arity, the array contents, the enumerators and
    the 64-byte alignment of the map the driver writes, which no GPU-free fake of the encoder
    itself would check."""
    import ctypes

    from pipetune.workers.runners import tensor_maps

    seen: dict = {}
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    prototype = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
        u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    )  # fmt: skip

    def driver(out, dtype, rank, address, dims, strides, box, element, *modes):
        seen.update(
            aligned=out % 64 == 0, dtype=dtype, rank=rank, address=address,
            dims=dims[:rank], strides=strides[: rank - 1], box=box[:rank],
            element=element[:rank], modes=modes,
        )  # fmt: skip
        ctypes.memmove(out, bytes(range(128)), 128)
        return 0

    stand_in = prototype(driver)

    class Library:
        cuTensorMapEncodeTiled = stand_in

    monkeypatch.setattr(tensor_maps.ctypes, "CDLL", lambda name: Library())
    spec = TensorMap("tmap_a", "A", (3072, 1024, 1), (6144, 6291456), (64, 128, 1))
    assert tensor_maps.encode_tensor_map(spec, 0x7F0000001000) == bytes(range(128))
    assert seen == {
        "aligned": True,
        "dtype": tensor_maps.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "rank": 3,
        "address": 0x7F0000001000,
        "dims": [3072, 1024, 1],
        "strides": [6144, 6291456],
        "box": [64, 128, 1],
        "element": [1, 1, 1],
        "modes": (0, 3, 3, 0),  # no interleave, 128-byte swizzle, 256-byte L2, zero fill
    }
