"""`pipetune.kernel`: a tuned kernel as a callable.

>>> k = pipetune.kernel({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100")
>>> k.schedule, k.launch.grid, k.launch.block, k.launch.smem_bytes   # the tuned schedule
>>> c = k(a, b)          # CuPy arrays or PyTorch CUDA tensors, fp16; C allocated
>>> k(a, b, c)           # or written into c

The schedule is the best known one (the local database's best measured trial, else the
model's pick; with `server`, the service's answer), unless one is given. The source is the
generator's (workers.codegen), the cubin NVRTC's through the compile cache
(workers.compile), and the launch geometry `workers.codegen.launch_config`'s, the same the
cupy runner timed. Only `__call__`'s launch needs a GPU.
"""

from __future__ import annotations

from typing import Any, cast

from pipetune.clients.library import cuda_launch, frameworks
from pipetune.clients.library.arrays import (
    ArrayInfo,
    Operand,
    check_arguments,
    data_pointer,
    operands,
)
from pipetune.clients.library.inputs import (
    ScheduleLike,
    WorkloadLike,
    as_gpu,
    as_schedule,
    as_workload,
)
from pipetune.clients.library.labels import SIMULATED_LABEL, is_simulated
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.knobs import ScheduleError
from pipetune.model.space import Schedule, schedule_problems
from pipetune.model.workloads import AnyWorkload, WorkloadError
from pipetune.workers.codegen import generate, launch_config
from pipetune.workers.compile import compile_kernel
from pipetune.workers.launch_plan import KernelLaunch


class TunedKernel:
    """One workload's kernel at one schedule: its source, cubin, launch, and a call."""

    def __init__(
        self,
        workload: AnyWorkload,
        gpu: str,
        schedule: Schedule,
        *,
        origin: str = "given",
        runner: str | None = None,
        latency_us: float | None = None,
        validate: bool = True,
    ):
        """`validate`: refuse a schedule outside the GPU's valid space (model.space); off
        for a schedule that was measured already (it ran, whatever the rules say now)."""
        problems = schedule_problems(schedule, workload, get_gpu(gpu)) if validate else []
        if problems:
            raise ScheduleError(
                f"schedule {schedule.id} is not valid for {workload.label()} on {gpu}: "
                + "; ".join(problems)
            )
        self.workload = workload
        self.gpu = gpu
        self.schedule = schedule
        self.origin = origin  # "measured" or "model" (the best known), or "given"
        self.runner = runner  # of a measured schedule ("simulated": the model plus noise)
        self.latency_us = latency_us
        self._kernel = generate(workload, schedule)
        self.launch: KernelLaunch = launch_config(self._kernel, workload)
        self.operands: tuple[Operand, ...] = operands(workload)
        self._functions: dict[tuple[int, str], Any] = {}

    @property
    def name(self) -> str:
        """The kernel's extern "C" name."""
        return self._kernel.name

    @property
    def source(self) -> str:
        """The full CUDA C++ source (header-free; NVRTC or nvcc compile it as is)."""
        return self._kernel.code

    @property
    def arch(self) -> str:
        """The architecture of the GPU it was tuned for (sm_90 for an H100)."""
        return get_gpu(self.gpu).arch

    @property
    def simulated(self) -> bool:
        return self.origin == "measured" and is_simulated(self.runner)

    def cubin(self, arch: str | None = None) -> bytes:
        """The cubin for `arch` (default: the tuned GPU's), compiled by NVRTC through the
        compile cache (no GPU needed)."""
        return compile_kernel(self._kernel, arch or self.arch).cubin

    def launch_document(self, arch: str | None = None) -> dict[str, Any]:
        """The launch as JSON: what `pipetune export` writes beside the cubin."""
        doc: dict[str, Any] = {
            "workload": self.workload.canonical(),
            "workload_label": self.workload.label(),
            "gpu": self.gpu,
            "arch": arch or self.arch,
            "schedule": self.schedule.as_dict(),
            "schedule_id": self.schedule.id,
            "schedule_origin": self.origin,
            **self.launch.as_dict(),
            "operands": [op.as_dict() for op in self.operands],
            "notes": [
                "parameters in `arguments` order: A, B, C as const __half*, const __half*, "
                "__half* (16-byte aligned, dense row-major), then the int32 scalars",
                "block = (threads, 1, 1); above 48 KiB of dynamic shared memory set "
                "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to dynamic_smem_bytes first",
            ],
        }
        if self.origin == "measured":
            doc["latency_us"] = self.latency_us
            doc["runner"] = self.runner
            if self.simulated:
                doc["latency_label"] = SIMULATED_LABEL
        return doc

    def _function(self, device: int) -> Any:
        arch = cuda_launch.device_arch(device)
        key = (device, arch)
        if key not in self._functions:
            self._functions[key] = cuda_launch.load_function(device, self.cubin(arch), self.launch)
        return self._functions[key]

    def __call__(self, *arrays: Any) -> Any:
        """Launch on CuPy arrays or PyTorch CUDA tensors: A, B and optionally C (the output,
        allocated like A when not given); returns C. The arrays are checked first (shape,
        dtype, strides, device; an ArgumentError names the wrong one) and used in place
        through DLPack. Asynchronous, as any launch on the caller's current stream."""
        infos: list[ArrayInfo] = check_arguments(self.operands, arrays)
        device = infos[0].device[1]
        if len(arrays) < len(self.operands):
            output = frameworks.allocate_output(arrays[0], device, self.operands[-1])
            arrays = (*arrays, output)
            infos = check_arguments(self.operands, arrays)
        stream = frameworks.current_stream(arrays[0], device)
        exchange = frameworks.dlpack_stream(stream)
        pointers = [
            data_pointer(op.name, array, info, exchange)
            for op, array, info in zip(self.operands, arrays, infos, strict=True)
        ]
        cuda_launch.launch(device, self._function(device), self.launch, pointers, stream)
        return arrays[-1]

    def __repr__(self) -> str:
        where = self.origin
        if self.simulated:
            where += f" ({SIMULATED_LABEL})"
        return (
            f"<pipetune kernel {self.name}: {self.workload.label()} on {self.gpu}, "
            f"schedule {self.schedule.id} ({where}), grid {self.launch.grid}, "
            f"block {self.launch.block}, {self.launch.smem_bytes} B shared memory>"
        )


def kernel(
    workload: WorkloadLike,
    gpu: str = "h100",
    schedule: ScheduleLike | None = None,
    server: str | None = None,
    *,
    db: str | None = None,
    api_key: str | None = None,
) -> TunedKernel:
    """The kernel of `workload` tuned for `gpu`: at `schedule` if given, else at the best
    known one (pipetune.best_schedule: the local database or, with `server`, the service;
    the model's pick when nothing was measured)."""
    w, key = as_workload(workload), as_gpu(gpu)
    family = family_of(w)
    if family.name != "tensor_gemm":
        raise WorkloadError(
            "op",
            f"{w.op}: pipetune.kernel calls the tensor-core GEMM family's kernels (gemm, bmm, "
            f"conv2d, conv3d); {family.name} kernels are tuned, swept and generated "
            "(`pipetune kernel source`), not yet wrapped as callables",
        )
    gemm = cast(AnyWorkload, w)  # the family checked above
    if schedule is not None:
        return TunedKernel(gemm, key, as_schedule(schedule))
    from pipetune.clients.library.lookup import best_schedule

    doc = best_schedule(w, key, server, db=db, api_key=api_key)
    return TunedKernel(
        gemm,
        key,
        doc.schedule.to_schedule(),
        origin=doc.source,
        runner=doc.runner,
        latency_us=doc.latency_us,
    )
