"""`pipetune.kernel`: a tuned kernel as a callable, of any kernel family.

>>> k = pipetune.kernel({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100")
>>> k.schedule, k.launch.grid, k.launch.block, k.launch.smem_bytes   # the tuned schedule
>>> c = k(a, b)          # CuPy arrays or PyTorch CUDA tensors, fp16; C allocated
>>> k(a, b, c)           # or written into c
>>> ln = pipetune.kernel({"op": "layernorm", "rows": 4096, "cols": 1024}, "h100")
>>> y = ln(x, gamma, beta)   # the memory-intensive operators the same way

The schedule is the best known one (the local database's best measured trial, else the
model's pick; with `server`, the service's answer), unless one is given. Everything else
comes from the workload's family's code generator (workers.families.codegen_for): the source
(``generate``), and the run as the runners take it (``launch_plan``: the buffers by name,
shape, dtype and role, and the launches in order), made with the same arguments as the
runners' ``trial_spec`` (the GPU's SMs, the model's resident blocks per SM), so what a caller
launches is what the cupy runner timed. The arrays a call takes are the plan's inputs, then
its outputs; a workspace (split rows' partials and counters, a stream-K GEMM's partial sums
and tile counters) is the kernel object's own, and so is a TMA tensor map (the wgmma
kernels'), encoded from the call's operand addresses.
The cubin is NVRTC's through the compile cache (workers.compile). Only `__call__`'s launch
needs a GPU.
"""

from __future__ import annotations

from typing import Any, cast

from pipetune.clients.library import cuda_launch, frameworks
from pipetune.clients.library.arrays import (
    ALIGN_BYTES,
    ArrayInfo,
    Operand,
    check_arguments,
    check_separate_outputs,
    data_pointer,
    operands,
)
from pipetune.clients.library.inputs import (
    AnySchedule,
    ScheduleArgumentError,
    ScheduleLike,
    WorkloadLike,
    as_gpu,
    as_schedule,
    as_workload,
)
from pipetune.clients.library.labels import SIMULATED_LABEL, is_simulated, older_kernel_label
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.family import GeneratorRevision, family_of, generator_revision_of
from pipetune.model.hardware import DEFAULT_GPU, get_gpu
from pipetune.model.knobs import ScheduleError
from pipetune.model.memops.space import workspace_bytes
from pipetune.model.memops.workloads import MemWorkload
from pipetune.model.occupancy import blocks_per_sm
from pipetune.model.wire import ScheduleResponse
from pipetune.model.workloads import DTYPE_SHORT, AnyWorkload
from pipetune.workers.compile import check_arch, compile_kernel, kernel_arch
from pipetune.workers.families import codegen_for
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan
from pipetune.workers.runners import tensor_maps
from pipetune.workers.runners.kernel_runner import model_view

# The uploaded tensor maps a kernel object keeps (each encodes one operand address): enough
# for a caller cycling through a few sets of arrays, bounded for one passing fresh ones.
TENSOR_MAP_CACHE = 64
WORKSPACE_CACHE = 16  # (device, stream, workspace) kept per kernel


class TunedKernel:
    """One workload's kernel at one schedule: its source, cubin, launches, and a call."""

    def __init__(
        self,
        workload: WorkloadLike,
        gpu: str,
        schedule: ScheduleLike,
        *,
        origin: str = "given",
        runner: str | None = None,
        latency_us: float | None = None,
        measured_generator_revision: int | None = None,
        validate: bool = True,
    ):
        """The arguments as `pipetune.kernel` takes them (a dict or a workload object; a
        GPU by key or alias; a schedule dict, object or document). `validate`: refuse a
        schedule outside the GPU's valid space (the family's rules); off for a schedule
        that was measured already (it ran, whatever the rules say now). A best-schedule
        answer as `schedule` must be this workload's on this GPU, and the kernel is
        labelled as the answer is (`origin`, `runner`, `latency_us` and the generator
        revision that made the timed kernel are its own)."""
        workload, gpu = as_workload(workload), as_gpu(gpu)
        if isinstance(schedule, ScheduleResponse):  # pipetune.best_schedule's answer
            _check_answer_is_for(workload, gpu, schedule)
            origin, runner, latency_us = schedule.source, schedule.runner, schedule.latency_us
            measured_generator_revision = schedule.measured_generator_revision
            validate = validate and schedule.source != "measured"  # it ran (as `export`)
        family = family_of(workload)
        spec = get_gpu(gpu)
        # The family's own schedule type (ScheduleError names a knob of another family's),
        # refused naming the argument, as every other refused argument is.
        try:
            schedule = cast(
                AnySchedule, family.parse_schedule(dict(as_schedule(schedule).as_dict()))
            )
        except ScheduleError as exc:
            raise ScheduleArgumentError(str(exc)) from None
        problems = family.schedule_problems(schedule, workload, spec) if validate else []
        if problems:
            raise ScheduleArgumentError(
                f"{schedule.id} is not valid for {workload.label()} on {gpu}: "
                + "; ".join(problems)
            )
        self.workload = workload
        self.gpu = gpu
        self.schedule = schedule
        self.origin = origin  # "measured" or "model" (the best known), or "given"
        self.runner = runner  # of a measured schedule ("simulated": the model plus noise)
        self.latency_us = latency_us
        # The generator revision whose kernel the latency is of (a GPU's measurement); where
        # it is not this code's, the time is an older kernel's (`older_kernel`).
        self.measured_generator_revision = measured_generator_revision
        self._codegen = codegen_for(family)
        self._kernel: Any = self._codegen.generate(workload, schedule)
        # One wave of resident blocks as the runners plan it before a launch (trial_spec):
        # the GPU's SMs times the model's blocks per SM (1 where the model has none).
        self.sm_count: int = spec.sm_count
        self.blocks_per_sm: int = model_view(workload, spec, [schedule])[1][0] or 1
        self.plan: LaunchPlan = self._codegen.launch_plan(
            self._kernel, workload, self.sm_count, self.blocks_per_sm
        )
        # A grid sized from one wave (a wave bound, or split rows whose blocks wait for each
        # other) is sized again at call time from the driver's occupancy, as the cupy runner
        # does: a model that overestimates it would deadlock a fused split.
        self.grid_depends_on_occupancy = bool(self._codegen.grid_depends_on_occupancy(self._kernel))
        self.occupancy_source = "model"  # or "cubin" (`size_grid_for_cubin`)
        self.operands: tuple[Operand, ...] = operands(
            self.plan, str(self._codegen.kernel_kind(workload))
        )
        self._functions: dict[tuple[int, str], dict[str, Any]] = {}
        self._device_plans: dict[int, LaunchPlan] = {}
        self._workspaces: dict[tuple[int, int, str, int], cuda_launch.DeviceMemory] = {}
        self._tensor_maps: dict[tuple[int, int, str, int], cuda_launch.DeviceMemory] = {}

    @property
    def name(self) -> str:
        """The kernel's (first) extern "C" name."""
        return str(self._kernel.name)

    @property
    def source(self) -> str:
        """The full CUDA C++ source (header-free; NVRTC or nvcc, `nvcc -c` included, compile it
        as is for `arch`: sm_90a's Hopper kernels name their nvcc flags in their first lines)."""
        return str(self._kernel.code)

    @property
    def generator(self) -> GeneratorRevision:
        """The code generator line that makes this kernel, at this code's revision."""
        return generator_revision_of(self.workload)

    @property
    def arch(self) -> str:
        """The architecture the kernel is built for: the tuned GPU's (sm_90 for an H100),
        its arch-specific target where the kernel needs one (sm_90a for wgmma)."""
        return kernel_arch(self._kernel, get_gpu(self.gpu).arch)

    @property
    def launch(self) -> KernelLaunch:
        """The first launch: entry, grid, block, dynamic shared memory, and the parameters
        in order (buffer names, then scalars; a workspace such as ``ws`` is one of the
        buffers, see `workspace`). A run may have more launches (`launches`)."""
        return self.plan.launches[0]

    @property
    def launches(self) -> tuple[KernelLaunch, ...]:
        """Every launch of one run, in order on one stream (two for split rows joined by a
        second kernel; one otherwise)."""
        return self.plan.launches

    @property
    def workspace(self) -> tuple[Buffer, ...]:
        """Device memory the launches need besides the arrays a caller passes: zeroed once
        before the first launch (the kernels return its counters to zero, a split row's or a
        stream-K tile's; the partial results they leave are written before they are read).
        A call allocates it itself, one per (device, stream); empty for the GEMMs but the
        stream-K one."""
        return self.plan.of_role("workspace")

    @property
    def simulated(self) -> bool:
        return self.origin == "measured" and is_simulated(self.runner)

    @property
    def older_kernel(self) -> str | None:
        """Where the latency was measured on an older revision of this kernel's generator,
        the words that say so (None: it is this kernel's time, or none was measured)."""
        if self.origin != "measured":
            return None
        return older_kernel_label(self.workload, self.measured_generator_revision)

    def cubin(self, arch: str | None = None) -> bytes:
        """The cubin for `arch` (default: the tuned GPU's), compiled by NVRTC through the
        compile cache (no GPU needed); every entry of the run is in it."""
        # (None, not any false value: an empty arch is refused, not read as the default.)
        return compile_kernel(self._kernel, self.arch if arch is None else arch).cubin

    def size_grid_for_cubin(self, arch: str | None = None) -> None:
        """Where the grid is sized from one wave of resident blocks, size it from the blocks
        per SM that the compiled cubin's registers and shared memory allow on the tuned GPU
        (counted as the driver counts them), where that is fewer than the model's: the
        model's register estimate can fall short of what ptxas allocates, and it counts
        neither the register file's sub-partitions nor shared memory's allocation unit; a
        launch document's grid that assumes more resident blocks than fit leaves a fused
        split's blocks waiting on ones that cannot start. (A call
        through `pipetune.kernel` sizes it from the driver's occupancy instead.)"""
        if not self.grid_depends_on_occupancy:
            return
        compiled = compile_kernel(self._kernel, self.arch if arch is None else arch)
        first = self.plan.launches[0]
        threads = first.block[0] * first.block[1] * first.block[2]
        smem = first.smem_bytes + compiled.smem_static_bytes
        fits = int(
            blocks_per_sm(get_gpu(self.gpu), threads, smem, compiled.registers, cuda_rules=True)
        )
        if 0 < fits < self.blocks_per_sm:
            self.plan = self._codegen.launch_plan(self._kernel, self.workload, self.sm_count, fits)
            self.blocks_per_sm = fits
            self.occupancy_source = "cubin"

    def _pointers_text(self, names: tuple[str, ...]) -> str:
        """Pointer parameters with their C types (a tensor map is a `const void*`)."""
        maps = {tm.name for tm in self.plan.tensor_maps}
        return ", ".join(
            f"{name} ({'const void*' if name in maps else self.plan.buffer(name).c_type})"
            for name in names
        )

    def _workspace_note(self, ws: Buffer) -> str:
        """What a workspace holds and what the kernels leave in it, per kernel kind: the
        note was the split rows' for every workspace, and said of a stream-K GEMM's W (float
        partial sums, no counter) that the kernels return its row counters to zero."""
        size = f"{ws.name}: a workspace of {ws.nbytes} bytes ({ws.dtype})"
        reuse = (
            "so it is reused as is, by one stream at a time (pipetune.kernel keeps one per stream)"
        )
        if isinstance(self.workload, MemWorkload):
            # workers/codegen/memops: a partial per (row, block), then two counters per row.
            if not workspace_bytes(self.schedule.knob_arrays(), self.workload).any():
                return (
                    f"{size}: not used by this schedule (its rows are not split); any device "
                    "buffer of that size will do"
                )
            return (
                f"{size}, the caller allocates and zeroes once before the first launch: "
                "split rows' partial results and two counters per row; the counters are "
                "back at zero when a run ends and each partial is written before it is read, "
                + reuse
            )
        if ws.name == "arrivals":  # workers/codegen/wgmma: the stream-K GEMM's
            return (
                f"{size}, the caller allocates and zeroes once before the first launch: an "
                "arrival counter per output tile; of the blocks that share a tile, the last "
                "to arrive sums it and returns its counter to zero, " + reuse
            )
        if ws.name == "W":
            return (
                f"{size}, the caller allocates once (zeroing it is harmless, not needed): "
                "the float partial sums of the output tiles several blocks share (two partial "
                "tiles per block); each block writes its own before the tile's last block "
                "reads them, and nothing in it is read in a later launch, " + reuse
            )
        # A workspace of a kind not described here: the safe use.
        return f"{size}: zero it before every launch, and give each launch its own"

    def _notes(self) -> list[str]:
        """How to launch from the document alone, written from the plan."""
        first = self.launch
        pointers = self._pointers_text(first.buffer_arguments)
        scalars = ", ".join(
            f"{name} ({kind})" for name, kind in first.parameters() if kind != "buffer"
        )
        trailing = self._pointers_text(first.trailing_arguments)
        then = f", then {trailing}" if trailing else ""
        notes = [
            f"parameters in `arguments` order: {pointers}, then {scalars}{then}; a buffer "
            f"named twice is passed twice; arrays dense row-major, {ALIGN_BYTES}-byte aligned",
            "block = (threads, 1, 1); above 48 KiB of dynamic shared memory set "
            "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to dynamic_smem_bytes first",
        ]
        if len(self.launches) > 1:
            notes.append(
                "one run is every entry of `launches`, in order on one stream (the top-level "
                "kernel, grid, block and dynamic_smem_bytes are the first)"
            )
        notes += [self._workspace_note(ws) for ws in self.workspace]
        for tm in self.plan.tensor_maps:
            notes.append(
                f"{tm.name}: the 128-byte TMA tensor map of {tm.operand} in device memory, "
                "64-byte aligned: cuTensorMapEncodeTiled over its address "
                f"({DTYPE_SHORT[tm.dtype]}, rank {len(tm.dims)}, `tensor_maps` gives dims, "
                "byte strides and box), 128-byte "
                "swizzle, no interleave, zero fill, 256-byte L2 promotion, element strides 1"
            )
        notes += self._codegen.shape_notes(self._kernel, self.workload)
        if self.grid_depends_on_occupancy:
            occupancy_from = (
                "what the cubin's registers and shared memory allow"
                if self.occupancy_source == "cubin"
                else "the model's occupancy"
            )
            # (The family's own account: a persistent GEMM's grid is one block per SM
            # whatever the occupancy, a memory-bound operator's one wave of it.)
            notes.append(
                self._codegen.grid_note(
                    self._kernel,
                    self.workload,
                    self.gpu,
                    self.sm_count,
                    self.blocks_per_sm,
                    occupancy_from,
                )
            )
        return notes

    def launch_document(self, arch: str | None = None) -> dict[str, Any]:
        """The launch as JSON: what `pipetune export` writes beside the cubin (the first
        launch at the top level, every launch and buffer of the run under `launches` and
        `buffers`: the cupy runner's plan)."""
        doc: dict[str, Any] = {
            "workload": self.workload.canonical(),
            "workload_label": self.workload.label(),
            "gpu": self.gpu,
            # The target the cubin for `arch` is built for (sm_90 -> sm_90a for wgmma); one
            # NVRTC cannot build for is refused here as cubin() refuses it (the document
            # said "arch": "bogus").
            "arch": self.arch if arch is None else kernel_arch(self._kernel, check_arch(arch)),
            "schedule": self.schedule.as_dict(),
            "schedule_id": self.schedule.id,
            "schedule_origin": self.origin,
            **self.launch.as_dict(),
            "operands": [op.as_dict() for op in self.operands],
            "launches": [launch.as_dict() for launch in self.launches],
            "buffers": [{**b.as_dict(), "nbytes": b.nbytes} for b in self.plan.buffers],
            "output": self.plan.output,
            "workspace": [ws.name for ws in self.workspace],
            "occupancy": {
                "sm_count": self.sm_count,
                "blocks_per_sm": self.blocks_per_sm,
                "blocks_per_sm_from": self.occupancy_source,
                "grid_depends_on_occupancy": self.grid_depends_on_occupancy,
            },
            "notes": self._notes(),
        }
        if self.plan.tensor_maps:
            doc["tensor_maps"] = [tm.as_dict() for tm in self.plan.tensor_maps]
        if self.origin == "measured":
            doc["latency_us"] = self.latency_us
            doc["runner"] = self.runner
            if self.measured_generator_revision is not None:
                doc["measured_generator_revision"] = self.measured_generator_revision
            if self.simulated:
                doc["latency_label"] = SIMULATED_LABEL
            elif self.older_kernel:
                doc["latency_label"] = self.older_kernel
        doc["generator"] = self.generator.line
        doc["generator_revision"] = self.generator.revision
        return doc

    # ---- the call ------------------------------------------------------------------------

    def _loaded(self, device: int) -> dict[str, Any]:
        """The run's entries loaded on `device` (once per device and architecture)."""
        arch = cuda_launch.device_arch(device)
        key = (device, arch)
        if key not in self._functions:
            # A schedule tuned for a GPU with more shared memory than this device's: said
            # here, where the driver's answer was a bare CUDA_ERROR_INVALID_VALUE.
            limit = cuda_launch.max_shared_per_block(device)
            widest_smem = max(launch.smem_bytes for launch in self.launches)
            if widest_smem > limit:
                raise cuda_launch.CudaLaunchError(
                    f"{self.name} needs {widest_smem} bytes of shared memory per block where "
                    f"device {device} allows {limit}: it was tuned for {self.gpu}; tune it "
                    "for this GPU"
                )
            cubin = self.cubin(arch)
            # An entry launched twice takes the larger dynamic shared memory limit.
            widest: dict[str, KernelLaunch] = {}
            for launch in self.launches:
                if launch.smem_bytes >= widest.get(launch.kernel, launch).smem_bytes:
                    widest[launch.kernel] = launch
            self._functions[key] = {
                name: cuda_launch.load_function(device, cubin, launch)
                for name, launch in widest.items()
            }
        return self._functions[key]

    def _device_plan(self, device: int, functions: dict[str, Any]) -> LaunchPlan:
        """The plan to launch on `device`: `plan`, or, where the grid depends on it, planned
        again with the driver's occupancy of the loaded first entry on the device's SMs
        (workers.runners.cupy_child does the same before it times a trial)."""
        if not self.grid_depends_on_occupancy:
            return self.plan
        if device not in self._device_plans:
            first = self.plan.launches[0]
            blocks = cuda_launch.occupancy(device, functions[first.kernel], first)
            try:
                plan = self._codegen.launch_plan(
                    self._kernel, self.workload, cuda_launch.sm_count(device), max(1, blocks)
                )
            except ValueError as exc:  # a row's blocks cannot all be resident there
                raise cuda_launch.CudaLaunchError(
                    f"{self.name} cannot run on device {device}: {exc}"
                ) from None
            self._device_plans[device] = plan
        return self._device_plans[device]

    def _workspace_addresses(self, device: int, stream: int, plan: LaunchPlan) -> dict[str, int]:
        """The plan's workspaces on `device` for `stream`, allocated and zeroed on first
        use. One per stream: the kernels return a workspace's counters to zero when they
        finish (and write its partials before they read them), so launches in order may
        share it, launches on two streams at once may not."""
        addresses: dict[str, int] = {}
        for ws in plan.of_role("workspace"):
            key = (device, stream, ws.name, ws.nbytes)
            memory = self._workspaces.pop(key, None)
            if memory is None:
                memory = cuda_launch.allocate_zeroed(device, ws.nbytes, stream)
            self._workspaces[key] = memory  # (re)inserted last: the most recently used
            addresses[ws.name] = memory.address
        # A caller that makes a stream for each call would otherwise keep a workspace per
        # stream for the kernel's life: the least recently used are freed.
        while len(self._workspaces) > WORKSPACE_CACHE:
            del self._workspaces[next(iter(self._workspaces))]
        return addresses

    def _tensor_map_addresses(
        self, device: int, stream: int, plan: LaunchPlan, addresses: dict[str, int]
    ) -> dict[str, int]:
        """The plan's tensor maps over the operands at `addresses`, encoded and uploaded on
        `stream` on first use. Kept per (device, stream, map, operand address): a map holds
        its operand's address, so calls on the same arrays reuse it; the least recently
        used beyond TENSOR_MAP_CACHE are freed."""
        out: dict[str, int] = {}
        for tm in plan.tensor_maps:
            key = (device, stream, tm.name, addresses[tm.operand])
            memory = self._tensor_maps.pop(key, None)
            if memory is None:
                encoded = tensor_maps.encode_tensor_map(tm, addresses[tm.operand])
                memory = cuda_launch.upload(device, encoded, stream)
            self._tensor_maps[key] = memory  # (re)inserted last: the most recently used
            out[tm.name] = memory.address
        while len(self._tensor_maps) > TENSOR_MAP_CACHE:
            del self._tensor_maps[next(iter(self._tensor_maps))]
        return out

    def __call__(self, *arrays: Any) -> Any:
        """Launch on CuPy arrays or PyTorch CUDA tensors: the inputs (`operands` in order:
        A, B for a GEMM; x, then gamma and beta or bias, for a row operator) and
        optionally the output (C, y; allocated like the first input when not given);
        returns the output. The arrays are checked first (shape, dtype, strides, device;
        an ArgumentError names the wrong one) and used in place through DLPack; a
        workspace is allocated on first use. Asynchronous, as any launch on the caller's
        current stream."""
        infos: list[ArrayInfo] = check_arguments(self.operands, arrays)
        device = infos[0].device[1]
        if len(arrays) < len(self.operands):
            missing = self.operands[len(arrays) :]
            made = [frameworks.allocate_output(arrays[0], device, op) for op in missing]
            arrays = (*arrays, *made)
            infos = check_arguments(self.operands, arrays)
        stream = frameworks.current_stream(arrays[0], device)
        exchange = frameworks.dlpack_stream(stream)
        addresses = {
            op.name: data_pointer(op.name, array, info, exchange)
            for op, array, info in zip(self.operands, arrays, infos, strict=True)
        }
        check_separate_outputs(self.operands, addresses)
        functions = self._loaded(device)
        plan = self._device_plan(device, functions)
        addresses |= self._workspace_addresses(device, stream, plan)
        addresses |= self._tensor_map_addresses(device, stream, plan, addresses)
        for launch in plan.launches:
            pointers = [addresses[name] for name in launch.pointer_arguments]
            cuda_launch.launch(device, functions[launch.kernel], launch, pointers, stream)
        outputs = [a for op, a in zip(self.operands, arrays, strict=True) if op.output]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __repr__(self) -> str:
        where = self.origin
        if self.simulated:
            where += f" ({SIMULATED_LABEL})"
        elif self.older_kernel:
            where += f" ({self.older_kernel})"
        more = f", then {len(self.launches) - 1} more launch" if len(self.launches) > 1 else ""
        return (
            f"<pipetune kernel {self.name}: {self.workload.label()} on {self.gpu}, "
            f"schedule {self.schedule.id} ({where}), grid {self.launch.grid}, "
            f"block {self.launch.block}, {self.launch.smem_bytes} B shared memory{more}>"
        )


def kernel(
    workload: WorkloadLike,
    gpu: str = DEFAULT_GPU,
    schedule: ScheduleLike | None = None,
    server: str | None = None,
    *,
    db: str | None = None,
    api_key: str | None = None,
) -> TunedKernel:
    """The kernel of `workload` (any family: gemm, gemm_swiglu, gemm_bias_gelu, bmm, conv2d,
    conv3d, reduce, softmax, layernorm, rmsnorm, bias_gelu, silu_mul, hopper_gemm, hopper_bmm,
    hopper_gemm_bias_gelu, hopper_gemm_swiglu; a gemm_bias_gelu kernel, either family's, is
    called with A, B and the bias) tuned for `gpu`: at
    `schedule` if given, else at the best known one (pipetune.best_schedule: the local
    database or, with `server`, the service; the model's pick when nothing was measured).
    `schedule` may be pipetune.best_schedule's answer for this workload on this GPU
    (labelled as it was found); one for another is refused (its `.schedule` runs that
    schedule here)."""
    w, key = as_workload(workload), as_gpu(gpu)
    if schedule is not None:
        # Where to look the schedule up means nothing beside the schedule itself: refused,
        # not silently ignored (the caller may believe the service's pick was used).
        for name, value in (("server", server), ("db", db), ("api_key", api_key)):
            if value is not None:
                raise InvalidArgumentError(name, f"give schedule or {name}, not both")
        return TunedKernel(w, key, schedule)  # an answer is checked and labelled there
    from pipetune.clients.library.lookup import best_schedule

    return TunedKernel(w, key, best_schedule(w, key, server, db=db, api_key=api_key))


def _check_answer_is_for(
    workload: AnyWorkload | MemWorkload, gpu: str, doc: ScheduleResponse
) -> None:
    """A best-schedule answer passed as `schedule` must be the answer for this workload on
    this GPU: another's was silently run on a shape (or a GPU) it was never the best of."""
    # Compared as parsed workloads, not as the answer's dict: a field the answering service
    # writes at its default is the same workload.
    try:
        parsed = as_workload(doc.workload)
    except ValueError:
        parsed = None
    if parsed is not None and parsed.canonical() == workload.canonical() and doc.gpu == gpu:
        return
    answered = parsed.label() if parsed is not None else str(doc.workload)
    raise InvalidArgumentError(
        "schedule",
        f"is the best schedule of {answered} on {doc.gpu}, not of {workload.label()} on "
        f"{gpu}: pass its .schedule to run that schedule here",
    )
