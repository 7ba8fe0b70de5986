"""`pipetune export`: what was tuned, as files a build or another tuner can use.

Tuned kernels (`export_tuned`), for every workload with a measured trial on the GPU, at its
best measured schedule:

    <stem>.cu             the CUDA source (compiles with NVRTC or nvcc as is, for the arch
                          the cubin's name gives; a Hopper kernel's first lines say its nvcc
                          flags: -gencode arch=compute_90a,code=sm_90a)
    <stem>.<arch>.cubin   its cubin for the GPU's architecture, or its arch-specific target
                          where the kernel needs one (sm_90a: the Hopper wgmma family)
    <stem>.launch.json    grid, block, dynamic shared memory, parameter order, operands;
                          every launch and buffer of the run (a workspace to zero included)
    <stem>.tensor_maps.h  for a kernel that reads its operands through TMA tensor maps (the
                          Hopper wgmma family): a host function that encodes them
    pipetune_tuned.h      every workload's tuned parameters as #defines (its family's knobs)
    index.json            the list: workload, schedule, latency, runner, file names

`<stem>` is the workload's label made an identifier, 8 hex digits of its hash and the GPU's
key (`gemm_1024x64x2048_d4779d91_h100`), and each kernel's extern "C" name is its
generator's with the GPU's key after it: two GPUs' exports of one workload build into one
program (each GPU's .cu for its own -arch, the program choosing by device at run time), and
one translation unit includes both GPUs' headers, without a name defined twice
(`one_gpu_aliases`: the names a one-GPU export had, kept where they are not ambiguous).
Workloads tuned to the same kernel (a GEMM kernel takes its shape as arguments) share the
first one's .cu and cubin: their index.json entries name those files and
`shares_kernel_with` its stem, so each kernel is defined once and index.json's `nvcc`
command (`nvcc -c -std=c++17 -arch=<arch> *.cu`: without -arch nvcc targets an arch none of
them compiles for) builds them into one program (each .cu is a translation unit of its own:
two in one file redefine `namespace pt`). Every family's kernels are exported
(`pipetune.kernel` wraps them all: the tensor-core GEMMs, the memory-intensive operators and
the Hopper wgmma GEMMs); a tuned workload whose kernel cannot be made any more (its measured
schedule no longer plans, e.g. after a generator change), or whose tasks ended with every
trial failed, is listed in index.json's ``not_exported`` with the reason (``schedule_id``
null for the latter).
Exporting into the folder of an earlier export replaces it: the kernel files its index.json
listed and the new export does not write are removed (the folder's other files are left
alone). A folder whose index.json no pipetune export wrote is refused, as is a folder, a
device or a broken link where the export writes (check_export_dir), before any kernel is
compiled. Every cubin is compiled before the folder is made and the files written, all of
them or none (a failed or interrupted export leaves no trace, no new empty folder either).
A task's trials (`export_task_t4`, any family): a T4 results file (workers.datasets), which
`pipetune dataset info`, `pipetune bench tuner` and Kernel Tuner's T4 tools read. Every file
is written whole or not at all (a temporary file renamed into place). Latencies of the
simulated runner are labelled so in index.json, the launch files and the header, as are times
measured on a kernel that an older revision of its generator made (`latency_label`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipetune
from pipetune.clients.library.inputs import as_gpu
from pipetune.clients.library.kernel import TunedKernel
from pipetune.clients.library.labels import SIMULATED_LABEL, any_simulated, is_simulated
from pipetune.clients.library.store import Reader, all_tasks, source_of
from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError, PipetuneError
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.states import JobState
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import ScheduleResponse, TaskDoc, TrialDoc
from pipetune.workers.compile import compile_source
from pipetune.workers.compile.nvrtc import cubin_compiler
from pipetune.workers.datasets import Dataset, dataset_from_results, write_t4
from pipetune.workers.datasets.files import write_all_atomic
from pipetune.workers.datasets.pipetune import t4_timestamp

HEADER_NAME = "pipetune_tuned.h"
TENSOR_MAPS_SUFFIX = ".tensor_maps.h"
# The driver's names of each operand type a tensor map may hold (cuda.h CUtensorMapDataType).
TENSOR_MAP_DATA_TYPES = {
    "float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
}
INDEX_NAME = "index.json"


class NothingToExportError(PipetuneError, ValueError):
    """A task with no finished trial yet (or ever, once it ended): not bad input, a state
    (the CLI's exit 1, where a refused argument is 2)."""


def _identifier(text: str) -> str:
    """Text as a lowercase file-name and C identifier part: its words joined by "_"."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def workload_stem(workload: Any) -> str:
    """A file-name and macro-safe name of the workload: the label's words and the hash
    (labels alone can coincide, e.g. a GEMM's two B layouts). An export's stem before the
    GPU was part of it (`stem_of`), whose names `one_gpu_aliases` keeps."""
    return f"{_identifier(workload.label())}_{workload.workload_hash[:8]}"


def stem_of(workload: Any, gpu: str) -> str:
    """The workload's files' and macros' stem in an export for `gpu`: `workload_stem` and the
    GPU (two GPUs' exports of one workload go into one program)."""
    return f"{workload_stem(workload)}_{_identifier(gpu)}"


def symbol_of(kernel_name: str, gpu: str) -> str:
    """An exported kernel's extern "C" name: its generator's (the variant and the schedule,
    which two GPUs can share) and the GPU it was tuned for; two objects defining one name
    do not link into one program."""
    return f"{kernel_name}_{_identifier(gpu)}"


# A kernel's definition in a generated source (every family's: `extern "C" __global__ void
# __launch_bounds__(...)` and the name on its next line).
_KERNEL_DEFINITION = re.compile(
    r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\('
)


def defined_kernels(source: str) -> list[str]:
    """The extern "C" kernels a generated source defines, in order."""
    return _KERNEL_DEFINITION.findall(source)


def tuned_workloads(reader: Reader, gpu: str, tasks: list[TaskDoc] | None = None) -> list[Any]:
    """Every workload with a successful trial on the GPU (any family), in label order
    (`tasks`: every task of the reader's, where the caller read them already)."""
    found: dict[str, Any] = {}
    for task in all_tasks(reader) if tasks is None else tasks:
        if task.gpu == gpu and task.best is not None:
            workload = parse_any_workload(task.workload)
            found.setdefault(workload.workload_hash, workload)
    return sorted(found.values(), key=lambda w: (w.label(), w.workload_hash))


def failed_workloads(
    reader: Reader, gpu: str, tasks: list[TaskDoc] | None = None
) -> list[tuple[Any, int]]:
    """Every workload tuned on the GPU whose tasks ended with trials but no successful one
    (each failed), with its failed trials counted over those tasks, in label order. A task
    still running may yet succeed, and one that ended before any trial was never tuned."""
    failed: dict[str, tuple[Any, int]] = {}
    succeeded: set[str] = set()
    for task in all_tasks(reader) if tasks is None else tasks:
        if task.gpu != gpu:
            continue
        workload = parse_any_workload(task.workload)
        key = workload.workload_hash
        if task.best is not None:
            succeeded.add(key)
        elif task.is_finished() and task.trials_failed > 0:
            _, count = failed.get(key, (workload, 0))
            failed[key] = (workload, count + task.trials_failed)
    left = [pair for key, pair in failed.items() if key not in succeeded]
    return sorted(left, key=lambda pair: (pair[0].label(), pair[0].workload_hash))


@dataclass(frozen=True)
class Exported:
    stem: str
    kernel: TunedKernel
    best: ScheduleResponse
    # The stem whose .cu and cubin hold this kernel, where an earlier workload of the export
    # was tuned to the same kernel (None: its own): see export_tuned.
    kernel_stem: str | None = None

    @property
    def symbol(self) -> str:
        """The kernel's (first) extern "C" name in the export (`symbol_of`)."""
        return symbol_of(self.kernel.name, self.kernel.gpu)

    def source(self) -> str:
        """The kernel's source with each kernel it defines under its exported name (its
        generator's name and the GPU): the generator's kernel otherwise, byte for byte."""
        defined = defined_kernels(self.kernel.source)
        launched = {launch.kernel for launch in self.kernel.launches}
        if not defined or not launched <= set(defined):  # (a generator the pattern misses)
            raise RuntimeError(
                f"{self.kernel.name}: the kernels its source defines ({', '.join(defined)}) "
                f"are not the ones it launches ({', '.join(sorted(launched))})"
            )
        names = re.compile(r"\b(" + "|".join(map(re.escape, defined)) + r")\b")
        return names.sub(lambda m: symbol_of(m[1], self.kernel.gpu), self.kernel.source)

    def cubin(self) -> bytes:
        """The exported source's cubin for the kernel's architecture (NVRTC, cached)."""
        code = self.kernel_stem or self.stem
        return compile_source(self.source(), self.kernel.arch, filename=f"{code}.cu").cubin

    def launch_document(self) -> dict[str, Any]:
        """The kernel's launch document, its launches naming the exported kernels."""
        doc = self.kernel.launch_document(self.kernel.arch)
        for launch in (doc, *doc["launches"]):
            launch["kernel"] = symbol_of(launch["kernel"], self.kernel.gpu)
        return doc

    def entry(self) -> dict[str, Any]:
        # The kernel's own architecture: the GPU's, or its arch-specific target (sm_90a).
        arch = self.kernel.arch
        code = self.kernel_stem or self.stem
        entry: dict[str, Any] = {
            "stem": self.stem,
            "workload": self.kernel.workload.canonical(),
            "label": self.kernel.workload.label(),
            "kernel": self.symbol,
            "schedule": self.kernel.schedule.as_dict(),
            "schedule_id": self.kernel.schedule.id,
            "arch": arch,
            "latency_us": self.best.latency_us,
            "tflops": self.best.tflops,
            "throughput": self.best.throughput,
            "throughput_unit": self.best.throughput_unit,
            "runner": self.best.runner,
            # The device that measured it, as its worker registered it (or its dataset said).
            "device_name": self.best.device_name,
            "simulated": is_simulated(self.best.runner),
            # The generator line and revision of the exported kernel, and the revision whose
            # kernel the latency was measured on (absent for a simulated one).
            "generator": self.kernel.generator.line,
            "generator_revision": self.kernel.generator.revision,
            "files": {
                "source": f"{code}.cu",
                "cubin": f"{code}.{arch}.cubin",
                "launch": f"{self.stem}.launch.json",
            },
        }
        if self.kernel_stem is not None:
            entry["shares_kernel_with"] = self.kernel_stem
        if self.kernel.plan.tensor_maps:
            entry["files"]["tensor_maps"] = f"{self.stem}{TENSOR_MAPS_SUFFIX}"
        if self.kernel.measured_generator_revision is not None:
            entry["measured_generator_revision"] = self.kernel.measured_generator_revision
        if entry["simulated"]:
            entry["latency_label"] = SIMULATED_LABEL
        elif self.kernel.older_kernel:
            # (It said "measured" of a time an older kernel took: the convolutions' imported
            # sweeps timed revision 1, 1.25x this kernel's time.)
            entry["latency_label"] = self.kernel.older_kernel
        return entry


def in_comment(text: str) -> str:
    """Text written inside a generated C comment: one line, and nothing that ends the comment
    (a source's path or a runner's string is not ours to trust; "*/" there put what followed
    into every build that included the header)."""
    return " ".join(text.replace("*/", "* /").split())


def one_gpu_aliases(
    old_key: str,
    new_key: str,
    aliases: list[tuple[str, str]],
    first: tuple[str, ...] = (),
    later: tuple[str, ...] = (),
) -> list[str]:
    """Preprocessor lines that keep, for code written against a one-GPU export, the names it
    gave a workload before the GPU was part of them: `aliases`, (old name, this GPU's name).
    The first GPU's header of the workload in a translation unit defines them (and adds
    `first`); another GPU's undefines them (and adds `later`): they are ambiguous then, an
    error where used (each GPU's header defining them was a redefinition, only a warning,
    and the first one's values silently used). <old_key>_ALIASED says that some GPU's
    header defined them, <new_key>_ALIASED that this GPU's did (its second copy, from
    another folder, changes nothing)."""
    return [
        f"#if !defined({old_key}_ALIASED)  /* no other GPU's names for it yet */",
        f"#define {old_key}_ALIASED 1",
        f"#define {new_key}_ALIASED 1",
        *(f"#define {old} {new}" for old, new in aliases),
        *first,
        f"#elif !defined({new_key}_ALIASED)  /* another GPU's came first: ambiguous */",
        *(f"#undef {old}" for old, _ in aliases),
        *later,
        "#endif",
    ]


def tensor_maps_header(item: Exported) -> str:
    """C for the host: a function that encodes the TMA tensor maps the kernel reads its
    operands through (the launch JSON's `tensor_maps`: the shape is the workload's), over the
    caller's device addresses, with the driver's cuTensorMapEncodeTiled, as the runners do
    (workers/runners/tensor_maps.py)."""
    maps = item.kernel.plan.tensor_maps
    operands = list(dict.fromkeys(m.operand for m in maps))
    rank = max(len(m.dims) for m in maps)
    name = f"pipetune_{item.stem}_tensor_maps"
    old = workload_stem(item.kernel.workload)
    params = ", ".join(f"const void* {op}" for op in operands)
    names = ", ".join(m.name for m in maps)
    lines = [
        f"/* {item.stem}{TENSOR_MAPS_SUFFIX}: the TMA tensor maps {item.symbol} reads "
        f"{', '.join(operands)} through,",
        f"   for {in_comment(item.kernel.workload.label())} only (the maps hold the shape). "
        "Written by "
        f"pipetune {pipetune.__version__} export.",
        f"   {name}() encodes them over your operands' device addresses; copy each 128-byte",
        "   map to device memory (64-byte aligned, as any cudaMalloc) and pass those pointers",
        f"   where the launch JSON's arguments name {names}. Link with -lcuda.",
        f"   pipetune_{old}_tensor_maps, its name in a one-GPU export, is this function",
        "   while no other GPU's header of the workload is included. */",
        "#pragma once",
        "#include <cuda.h>",
        "",
        f"static inline CUresult {name}({params}, CUtensorMap maps[{len(maps)}]) {{",
        f"  static const cuuint32_t element_strides[{rank}] = {{{', '.join(['1'] * rank)}}};",
        "  CUresult status;",
    ]
    for i, m in enumerate(maps):
        lines += [
            f"  {{ /* {m.name}, over {m.operand} */",
            f"    static const cuuint64_t dims[{len(m.dims)}] = {{{', '.join(map(str, m.dims))}}};",
            f"    static const cuuint64_t strides[{max(1, len(m.strides))}] = "
            f"{{{', '.join(map(str, m.strides)) or '0'}}};",
            f"    static const cuuint32_t box[{len(m.box)}] = {{{', '.join(map(str, m.box))}}};",
            f"    status = cuTensorMapEncodeTiled(&maps[{i}], {TENSOR_MAP_DATA_TYPES[m.dtype]}, "
            f"{len(m.dims)}, (void*){m.operand}, dims, strides, box, element_strides,",
            "        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,",
            "        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);",
            "    if (status != CUDA_SUCCESS) return status;",
            "  }",
        ]
    lines += ["  return CUDA_SUCCESS;", "}", ""]
    lines += one_gpu_aliases(
        f"PIPETUNE_{old.upper()}_TENSOR_MAPS",
        f"PIPETUNE_{item.stem.upper()}_TENSOR_MAPS",
        [(f"pipetune_{old}_tensor_maps", name)],
    )
    lines.append("")
    return "\n".join(lines)


def _header(gpu: str, arch: str, source: str, exported: list[Exported]) -> str:
    """Kernel Tuner's convention (integration.create_device_targets): the tuned parameters
    as plain #defines under a TARGET_ guard, outside `kernel_tuner` builds; here one target
    per workload and GPU. PIPETUNE_<STEM>_<KNOB> are defined always, to use several at once;
    the stem ends in the GPU, so that two GPUs' headers can be included together. A one-GPU
    export's names (the stem without the GPU) are kept as `one_gpu_aliases`, TARGET_ of the
    old stem selecting the first GPU's parameters, and an error after another GPU's header."""
    suffix = f"_{_identifier(gpu)}"
    lines = [
        f"/* {HEADER_NAME}: the tuned parameters of every workload tuned on {gpu} ({arch}),",
        f"   written by pipetune {pipetune.__version__} export from {in_comment(source)}.",
        "   Generated: do not modify by hand; run `pipetune export` again instead.",
        "   -DTARGET_<stem> selects one workload's parameters as plain #defines (Kernel",
        "   Tuner's convention); PIPETUNE_<STEM>_<KNOB> are always defined. Each <stem> ends",
        f"   in {suffix}: another GPU's header can be included beside this one. A workload's",
        f"   names without {suffix} (a one-GPU export's) stand for this header's while no",
        "   other GPU's header of the workload is included; after one they are undefined",
        "   (and TARGET_ of such a stem is an error): they would be ambiguous. */",
        "#pragma once",
        "",
    ]
    for item in exported:
        best = item.best
        how = SIMULATED_LABEL if is_simulated(best.runner) else f"measured: {best.runner}"
        if item.kernel.older_kernel:
            how += f"; {item.kernel.older_kernel}"
        lines.append(
            f"/* {in_comment(item.kernel.workload.label())}: {item.symbol}, "
            f"{best.latency_us:.3f} us ({in_comment(how)}) */"
        )
        knobs = family_of(item.kernel.workload).knob_names
        new, old = item.stem, workload_stem(item.kernel.workload)
        for knob in knobs:
            value = getattr(item.kernel.schedule, knob)
            lines.append(f"#define PIPETUNE_{new.upper()}_{knob.upper()} {value}")
        lines += one_gpu_aliases(
            f"PIPETUNE_{old.upper()}",
            f"PIPETUNE_{new.upper()}",
            [(f"PIPETUNE_{old.upper()}_{k.upper()}", f"PIPETUNE_{new.upper()}_{k.upper()}")
             for k in knobs],
            first=(
                f"#if defined(TARGET_{old}) && !defined(TARGET_{new})",
                f"#define TARGET_{new}",
                "#endif",
            ),
            later=(
                f"#if defined(TARGET_{old})",
                f'#error "TARGET_{old} is ambiguous: the workload is tuned for two GPUs here; '
                f'define TARGET_{new} or the other GPU stem"',
                "#endif",
            ),
        )  # fmt: skip
        lines.append("")
    lines.append("#ifndef kernel_tuner /* only use these when not tuning */")
    for i, item in enumerate(exported):
        lines.append(f"#{'if' if i == 0 else 'elif'} defined(TARGET_{item.stem})")
        knobs = family_of(item.kernel.workload).knob_names
        lines += [f"#define {k} {getattr(item.kernel.schedule, k)}" for k in knobs]
    if exported:
        lines.append("#endif /* TARGET_ */")
    lines += ["#endif /* kernel_tuner */", ""]
    return "\n".join(lines)


def is_export_index(document: Any) -> bool:
    """An index.json that a pipetune export wrote: the fields every one has had since the
    first export (the version, the GPU, the header's name, the list of workloads)."""
    return (
        isinstance(document, dict)
        and isinstance(document.get("pipetune"), str)
        and isinstance(document.get("gpu"), str)
        and document.get("header") == HEADER_NAME
        and isinstance(document.get("workloads"), list)
    )


def _out_dir_error(reason: str) -> InvalidArgumentError:
    return InvalidArgumentError("out_dir", reason)


def _as_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """The folder argument as a Path. An empty one is refused: Path("") is Path("."), and the
    export went into the current folder (deleting the files an index.json there listed)."""
    if not isinstance(out_dir, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            "out_dir", f"expected a folder's path, got {type(out_dir).__name__}"
        )
    if not os.fspath(out_dir):
        raise _out_dir_error("empty: give the folder to export to ('.' for the current one)")
    return Path(out_dir)  # (a str was an AttributeError at its mkdir)


def _check_file_target(path: Path) -> None:
    """A name the export writes a file at holds a regular file (or a link to one) or
    nothing: a folder there failed the rename only after every kernel was compiled, and a
    device or a FIFO would be replaced by a file."""
    if path.is_symlink() and not path.exists():
        # (Written through: a link left in the folder made the export create its target,
        # wherever it pointed, outside the folder too.)
        raise _out_dir_error(
            f"{path} is a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        )
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there
    if stat.S_ISDIR(mode):
        raise _out_dir_error(f"{path} is a directory, where the export writes a file")
    if not stat.S_ISREG(mode):
        raise _out_dir_error(f"{path} is not a regular file, where the export writes one")


def _check_folder(out_dir: Path) -> None:
    """The folder exists as a directory or can be made: the first of it and its parents
    that is there is a directory. A link to nothing failed mkdir with FileExistsError
    (exists() is False for it, so nothing had noticed), a file NotADirectoryError, both
    only after every kernel was compiled."""
    for path in (out_dir, *out_dir.parents):
        if path.is_symlink() and not path.exists():
            raise _out_dir_error(
                f"{path} is a broken symbolic link (to {os.readlink(path)}, which does not exist)"
            )
        if path.exists():
            if not path.is_dir():
                raise _out_dir_error(f"{path} is not a directory")
            return


def check_export_dir(out_dir: str | os.PathLike[str]) -> set[str]:
    """Refuse, before any kernel is compiled, a folder the export cannot write or must not
    overwrite (InvalidArgumentError naming `out_dir`): empty, a broken link, a file, a
    folder or a device where index.json or the header goes, or an index.json that no
    pipetune export wrote (its files would be deleted and it replaced: the folder is someone
    else's). Returns the kernel files the earlier export there listed (see export_tuned)."""
    out_dir = _as_out_dir(out_dir)
    _check_folder(out_dir)
    _check_file_target(out_dir / HEADER_NAME)
    index_path = out_dir / INDEX_NAME
    _check_file_target(index_path)
    if not index_path.exists():
        return set()
    try:
        index = json.loads(index_path.read_bytes())
    except OSError as exc:
        raise _out_dir_error(
            f"{index_path} cannot be read ({exc.strerror or exc}): whether an earlier export "
            "wrote it is unknown"
        ) from None
    except ValueError:  # not JSON (nor a partial index: ours is written whole or not at all)
        index = None
    if not is_export_index(index):
        raise _out_dir_error(
            f"{index_path} is not a pipetune export's index: the folder is not an earlier "
            "export's; give another folder, or remove that file"
        )
    return _previous_export_files(index)


def _previous_export_files(index: dict[str, Any]) -> set[str]:
    """The kernel files an earlier export's index listed: plain file names in the folder
    only, so that an index.json edited by hand cannot name a file outside it."""
    names = [
        name
        for entry in index["workloads"]
        if isinstance(entry, dict) and isinstance(entry.get("files"), dict)
        for name in entry["files"].values()
    ]
    return {n for n in names if isinstance(n, str) and n and Path(n).name == n and n[0] != "."}


def _share_kernels(
    candidates: list[tuple[int, Any, ScheduleResponse, TunedKernel]],
) -> list[Exported]:
    """Each candidate as exported: a kernel's name is its source (the family's variant and
    the schedule; the shape is arguments), so two workloads tuned to one kernel share the
    first one's .cu and cubin and every .cu of an export builds into one program (the same
    extern "C" kernel defined in two files was a duplicate symbol at link time)."""
    kernel_stems: dict[tuple[str, str], str] = {}  # (kernel, source) -> the first stem
    exported: list[Exported] = []
    for _, workload, best, kernel in candidates:
        stem = stem_of(workload, kernel.gpu)
        first = kernel_stems.setdefault((kernel.name, kernel.source), stem)
        exported.append(Exported(stem, kernel, best, None if first == stem else first))
    return exported


def _check_kernel_targets(out_dir: Path, exported: list[Exported]) -> None:
    for item in exported:
        for name in item.entry()["files"].values():
            _check_file_target(out_dir / name)


def _make_folder(out_dir: Path) -> list[Path]:
    """mkdir -p, returning the folders it made, deepest first (removed again where the
    writes fail: a failed export leaves no trace)."""
    made = []
    for path in (out_dir, *out_dir.parents):
        if path.exists():
            break
        made.append(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    return made


def build_command(gpu_arch: str, kernel_arches: list[str]) -> str:
    """The nvcc command, run in the export's folder, that builds every exported kernel into
    one program's objects (index.json's `nvcc`). Without -arch nvcc 13 targets sm_75, where
    no kernel of ours compiles (cp.async, f16x2 conversions, wgmma); with an arch-specific
    kernel (sm_90a: the Hopper wgmma family) every source is built for that target, which
    runs the GPU's plain sm_90 code too."""
    specific = sorted({a for a in kernel_arches if a != gpu_arch and a.startswith(gpu_arch)})
    target = specific[0] if specific else gpu_arch
    return f"nvcc -c -std=c++17 -arch={target} *.cu"


def export_tuned(reader: Reader, gpu: str, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write every tuned workload's kernel on `gpu` into `out_dir` (see the module
    docstring); returns the index document. A folder that cannot take the export (see
    check_export_dir) is refused before anything is compiled; nothing is written, and no
    folder made, until every kernel has compiled."""
    gpu = as_gpu(gpu)
    previous = check_export_dir(out_dir)
    out_dir = Path(out_dir)
    arch = get_gpu(gpu).arch
    tasks = all_tasks(reader)
    # (the workload's place in label order, workload, its best answer, its kernel)
    candidates: list[tuple[int, Any, ScheduleResponse, TunedKernel]] = []
    # (the workload's place in label order, its entry): listed in label order at the end.
    not_exported: list[tuple[int, dict[str, Any]]] = []
    for place, workload in enumerate(tuned_workloads(reader, gpu, tasks)):
        best = reader.best_schedule(workload, gpu)
        if best.source != "measured":
            # No trial to export: its successes were deleted meanwhile, or each failed on
            # the GPU elsewhere (the service never answers a schedule that failed there).
            reason = (
                f"no trial of it to export: the answer is the {best.source}'s pick (every "
                "success it had failed on the GPU, or was deleted)"
            )
            not_exported.append((place, _not_exported(workload, best.schedule_id, reason)))
            continue
        try:
            kernel = TunedKernel(
                workload,
                gpu,
                best.schedule.to_schedule(),
                origin="measured",
                runner=best.runner,
                latency_us=best.latency_us,
                measured_generator_revision=best.measured_generator_revision,
                validate=False,
            )
        except ValueError as exc:  # ScheduleError, or a plan that no longer fits the GPU
            reason = f"{type(exc).__name__}: {exc}"
            not_exported.append((place, _not_exported(workload, best.schedule_id, reason)))
            continue
        candidates.append((place, workload, best, kernel))
    # Every name a kernel's files take, checked before the first compile (a folder at one
    # of them failed the write after every kernel had compiled).
    _check_kernel_targets(out_dir, _share_kernels(candidates))
    kept: list[tuple[int, Any, ScheduleResponse, TunedKernel]] = []
    for place, workload, best, kernel in candidates:
        try:
            kernel.size_grid_for_cubin()  # (compiles the kernel where its grid needs it)
        except ValueError as exc:  # the cubin's occupancy leaves a row's blocks no wave
            reason = f"{type(exc).__name__}: {exc}"
            not_exported.append((place, _not_exported(workload, best.schedule_id, reason)))
            continue
        kept.append((place, workload, best, kernel))
    exported = _share_kernels(kept)
    if len(kept) < len(candidates):  # a first kernel left out: another workload's files now
        _check_kernel_targets(out_dir, exported)
    # Every file made (every cubin compiled) before the folder is made or any file written,
    # then all written or none (write_all_atomic): a kernel whose compile failed part-way
    # through left the kernels before it written beside the earlier export's index, a folder
    # that was neither export, and an interrupted export into a new folder left it empty.
    out: list[tuple[Path, bytes]] = []
    for item in exported:
        files = item.entry()["files"]
        if item.kernel_stem is None:
            out.append((out_dir / files["source"], item.source().encode()))
            out.append((out_dir / files["cubin"], item.cubin()))
        launch = item.launch_document()
        out.append((out_dir / files["launch"], (json.dumps(launch, indent=2) + "\n").encode()))
        if "tensor_maps" in files:
            out.append((out_dir / files["tensor_maps"], tensor_maps_header(item).encode()))
    source = source_of(reader)
    entries = [item.entry() for item in exported]
    out.append((out_dir / HEADER_NAME, _header(gpu, arch, source, exported).encode()))
    # A workload whose every trial failed is tuned as much as one with a success: left out
    # without a word, it read as one never tuned (tuned_workloads keeps successes only).
    labelled = [entry for _, entry in sorted(not_exported, key=lambda pair: pair[0])]
    labelled += [
        _not_exported(workload, None, f"no successful trial ({count} failed)")
        for workload, count in failed_workloads(reader, gpu, tasks)
    ]
    index = {
        "pipetune": pipetune.__version__,
        "gpu": gpu,
        "arch": arch,
        "nvcc": build_command(arch, [item.kernel.arch for item in exported]),
        # What built the cubins (NVRTC's version and build) and the driver that loads them.
        "cubins": cubin_compiler(),
        "source": source,
        "header": HEADER_NAME,
        "simulated": any_simulated(item.best.runner for item in exported),
        "workloads": entries,
        "not_exported": labelled,
    }
    out.append((out_dir / INDEX_NAME, (json.dumps(index, indent=2) + "\n").encode()))
    made = _make_folder(out_dir)
    try:
        write_all_atomic(out)
    except BaseException:
        for folder in made:  # deepest first; a folder something else wrote in stays
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    # An export into the folder of an earlier one (another GPU's, or before a workload's
    # tasks were deleted) replaces it: the earlier kernels this one does not write would
    # otherwise stay beside the new index, and a build that globs *.cubin would link them.
    # Removed after the new index is written; files the earlier index did not list (the
    # user's own) are left alone.
    written = {name for entry in entries for name in entry["files"].values()}
    for name in sorted(previous - written):
        (out_dir / name).unlink(missing_ok=True)
    return index


def _not_exported(workload: Any, schedule_id: str | None, reason: str) -> dict[str, Any]:
    """index.json's entry for a tuned workload left out (schedule_id None: no schedule of
    it to name, every trial failed)."""
    return {
        "workload": workload.canonical(),
        "label": workload.label(),
        "schedule_id": schedule_id,
        "reason": reason,
    }


def _trial_result(trial: TrialDoc) -> MeasureResult | None:
    """A trial as a measurement (None: no outcome yet, or cancelled before it had one).
    A lost trial is a timeout, as the tuner saw it; one in a state this client does not know
    (a newer service's) is left out, as one without an outcome is."""
    if trial.state not in set(JobState):
        return None
    state = JobState(trial.state)
    if state is JobState.LOST:
        return MeasureResult(status="timeout", error=trial.error or "lost", runner=trial.runner)
    if trial.status is None or not state.has_result():
        return None
    ok = trial.status == "ok"
    # The whole measurement, as the worker reported it: the T4 file's runtimes, compile time
    # and counts (they were dropped: an export kept the median latency alone).
    return MeasureResult(
        status=trial.status,
        latency_us=trial.latency_us if ok else None,
        samples_us=trial.samples_us or [],
        spread=trial.spread,
        registers=trial.registers,
        spill_bytes=trial.spill_bytes,
        smem_bytes=trial.smem_bytes,
        compile_ms=trial.compile_ms,
        max_abs_error=trial.max_abs_error,
        error=trial.error,
        runner=trial.runner,
        generator_revision=trial.generator_revision,
    )


def task_dataset(reader: Reader, task_id: int) -> Dataset:
    """A task's trials with an outcome, in proposal order, as a pipetune dataset."""
    task = reader.task(task_id)
    trials = reader.all_trials(task_id, samples=True)
    pairs = [(t, r) for t in trials if (r := _trial_result(t)) is not None]
    if not pairs:
        # "yet" only while the task can still finish one (not once it was cancelled or ended).
        ended = f" (it ended {task.state})" if task.is_finished() else " yet"
        raise NothingToExportError(f"task {task_id} has no finished trial to export{ended}")
    runners = sorted({t.runner for t, _ in pairs if t.runner})
    # The GPUs its workers registered (a T4 file's device_name; none for simulated workers);
    # an imported task's trials had no worker here: the device its file named.
    devices = sorted({t.worker_device for t, _ in pairs if t.worker_device})
    device_name = ", ".join(devices) or task.imported_device_name
    # An imported task's settings are its file's (a sweep's warm-up and repeats): the task
    # only holds those trials, and an export of it writes back what was imported.
    settings = task.imported_settings
    if settings is None and task.imported_from is not None:
        settings = {}  # (its file stated none pipetune could keep: not the task's own)
    elif settings is None:
        settings = {
            "task_id": task.id,
            "strategy": task.strategy,
            "seed": task.seed,
            "budget": task.budget,
            "order": "proposal order of the task's trials",
            "source": source_of(reader),
        }
    return dataset_from_results(
        parse_any_workload(task.workload),
        get_gpu(task.gpu),
        [t.schedule.to_schedule() for t, _ in pairs],
        [r for _, r in pairs],
        runner=",".join(runners) or "unknown",
        device_name=device_name,
        # When each outcome was recorded, not when the file is written; a trial without a
        # time (imported from a file without one) has none in the file either.
        timestamps=[
            None if t.finished_at is None else t4_timestamp(t.finished_at) for t, _ in pairs
        ],
        settings=settings,
    )


def export_task_t4(reader: Reader, task_id: int, out: Path) -> Dataset:
    """Write a task's trials as a T4 results file (gzipped when `out` ends in .gz)."""
    dataset = task_dataset(reader, task_id)
    write_t4(dataset, out)
    return dataset
