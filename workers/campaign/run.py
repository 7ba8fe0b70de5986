"""`pipetune campaign`: the one command a lent GPU runs, phase after phase, each its own file.

1. probe: the device, cuBLAS and an fp16 cast checked first (then cuDNN), the timing floor;
2. correctness: >= 300 schedules of each kernel family swept verified
   (workers.campaign.correctness); > 1% of a family's failed stops;
3. profile: `pipetune calibrate`'s hardware profile;
4. baselines: the vendor libraries' time per operator;
5. sweeps: every schedule of every operator, in parts, until the deadline;
6. campaign.json: what each call did and how long it took, what is left; the archive.

A phase whose file the ``--have`` folder or archive holds is skipped (the probe's checks
still run: every call is a new machine). The probe's GPU must match ``--gpu`` and the
``--have`` campaign's; a simulated campaign never mixes with a measured one.

Outcome: exit 0 when complete or paused cleanly at the deadline (campaign.json says what is
left), 1 when a check fails, correctness stops the campaign or something breaks, 2 for a
usage mistake. The summary and the archive are written whatever happens, but for a usage
mistake refused before anything was written (the out-dir and the archive are left as they
were: a ``--have`` is checked, and refused for another GPU model, before its files are
copied).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.model.hardware import GPUSpec, HardwareError, get_gpu, gpu_keys, resolve_gpu_key
from pipetune.model.trials import RunnerKind
from pipetune.workers.campaign import layout
from pipetune.workers.campaign.deadline import Deadline
from pipetune.workers.campaign.operators import DEFAULT_OPERATORS, families_of, resolve_operators
from pipetune.workers.campaign.packer import Packer
from pipetune.workers.campaign.plan import CAMPAIGN_SETTINGS, GpuSideCosts
from pipetune.workers.runners.base import RunnerError, RunnerSettingError, cupy_missing
from pipetune.workers.runners.isolation import IsolatedWorker, WorkerStartError
from pipetune.workers.runners.kernel_runner import KernelRunner

RUNNERS: tuple[str, ...] = (RunnerKind.CUPY.value, RunnerKind.SIMULATED.value)
FORMAT = 1
REQUIRED_CHECKS = ("matmul_fp32", "matmul_fp16", "fp16_cast")  # cuBLAS and a cast: first
DEFAULT_MINUTES = 8.0


class CampaignUsageError(PipetuneError, ValueError):
    """The command line is wrong (exit 2)."""


class CampaignError(PipetuneError, RuntimeError):
    """A check failed or the device broke (exit 1)."""


@dataclass(frozen=True)
class CampaignOptions:
    out_dir: Path
    gpu: str | None = None
    minutes: float = DEFAULT_MINUTES
    have: Path | None = None
    operators: str = DEFAULT_OPERATORS
    runner: str = "cupy"
    pack: Path | None = None
    device: int = 0
    command: tuple[str, ...] = ()


@dataclass
class CampaignOutcome:
    exit_code: int
    state: str  # complete | paused | stopped | failed
    message: str
    summary: dict[str, Any] = field(default_factory=dict)
    pack_bytes: int | None = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# The longest a campaign call may be given: a week. A device call lasts minutes; a larger
# value is a typo, and 1e308 minutes made an infinite budget in seconds (a JSON error).
MAX_MINUTES = 7 * 24 * 60.0


def minutes_problem(minutes: float) -> str | None:
    """Why a --minutes value cannot be a call's budget, or None."""
    if not 0 < minutes <= MAX_MINUTES:
        return f"must be more than 0 and at most {MAX_MINUTES:g} (a week), got {minutes:g}"
    return None


def check_options(options: CampaignOptions) -> None:
    """Everything that can be refused before any machine work (CampaignUsageError)."""
    if options.runner not in RUNNERS:
        raise CampaignUsageError(f"--runner: one of {', '.join(RUNNERS)}, got {options.runner!r}")
    if options.runner == RunnerKind.SIMULATED.value:
        from pipetune.workers.runners.simulated import time_scale_from_env

        try:  # (else read in the library child, and refused as "no usable CUDA GPU", exit 1)
            time_scale_from_env()
        except RunnerSettingError as exc:
            raise CampaignUsageError(str(exc)) from None
    if problem := minutes_problem(options.minutes):
        raise CampaignUsageError(f"--minutes: {problem}")
    if options.gpu is not None:
        try:
            resolve_gpu_key(options.gpu)
        except HardwareError as exc:
            raise CampaignUsageError(f"--gpu: {exc}") from None
    try:
        resolve_operators(options.operators)
    except ValueError as exc:
        raise CampaignUsageError(f"--operators: {exc}") from None
    if options.pack is not None and not options.pack.name.endswith((".tar.gz", ".tgz", ".tar")):
        raise CampaignUsageError(f"--pack: a .tar.gz or .tar file name, got {options.pack}")
    out = options.out_dir
    if options.pack is not None and _same_or_above(options.pack, out):
        # (else the whole call ran, and only then the archive could not replace the folder)
        raise CampaignUsageError(
            f"--pack {options.pack}: the --out-dir's own path; name a file beside it"
        )
    if out.exists() and not out.is_dir():
        raise CampaignUsageError(f"--out-dir {out}: exists and is not a folder")
    same = options.have is not None and options.have.is_dir() and _same(options.have, out)
    if out.is_dir() and any(out.iterdir()) and not same:
        raise CampaignUsageError(
            f"--out-dir {out}: not empty; give a new folder (and --have with the earlier "
            "campaign's folder or archive to continue it)"
        )
    if options.have is not None and not options.have.exists():
        raise CampaignUsageError(f"--have {options.have}: no such folder or archive")


def _same_or_above(a: Path, b: Path) -> bool:
    """Whether ``a`` is the folder ``b`` or one of the folders it is in."""
    try:
        resolved, below = a.resolve(), b.resolve()
    except OSError:
        return False
    return resolved == below or resolved in below.parents


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def resolve_device_gpu(device_name: str, asked: str | None, simulated: bool) -> str:
    """The model key of the GPU measured on (CampaignUsageError on a mismatch)."""
    if simulated:
        return resolve_gpu_key(asked) if asked else "h100"
    try:
        detected: str | None = resolve_gpu_key(device_name)
    except HardwareError:
        detected = None
    if asked is not None:
        key = resolve_gpu_key(asked)
        if detected is not None and detected != key:
            raise CampaignUsageError(
                f"--gpu {asked} was given, but the device is {device_name} ({detected}); "
                f"run with --gpu {detected}, or without --gpu to take the device's"
            )
        return key
    if detected is None:
        raise CampaignUsageError(
            f"the device is {device_name!r}, which the model has no spec for; name the "
            f"closest with --gpu ({', '.join(gpu_keys())})"
        )
    return detected


class LibraryChild:
    """The child process that describes the device, checks the libraries and times the
    vendor baselines (workers.campaign.cuda_side, or its simulated twin)."""

    def __init__(self, runner: str, device: int, stand_in: str | None):
        from pipetune.workers.campaign import cuda_side, sim_side

        self.side: ModuleType = sim_side if runner == "simulated" else cuda_side
        if runner == "cupy" and (missing := cupy_missing()):
            raise CampaignError(f"the cupy runner needs CuPy and an NVIDIA GPU; {missing}")
        self.worker = IsolatedWorker(
            self.side.init, (device, stand_in), start_timeout_s=180, name="pipetune-campaign"
        )
        try:
            self.worker.start()
        except WorkerStartError as exc:
            self.worker.close()
            raise CampaignError(f"no usable CUDA GPU: {exc}") from None

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 300) -> Any:
        outcome = self.worker.call(fn, *args, timeout_s=timeout_s)
        if not outcome.ok:
            raise CampaignError(f"{fn.__name__} failed: {outcome.kind}: {outcome.error}")
        return outcome.value

    def close(self) -> None:
        self.worker.close()


def open_runner(options: CampaignOptions, gpu: GPUSpec) -> KernelRunner:
    workers = max(1, (os.cpu_count() or 2) - 2)  # leave cores to the GPU process and us
    if options.runner == "simulated":
        from pipetune.workers.runners.sim_runner import SimulatedLaunchRunner

        return SimulatedLaunchRunner(gpu, settings=CAMPAIGN_SETTINGS, compile_workers=workers)
    from pipetune.workers.runners.cupy_runner import CupyRunner

    return CupyRunner(
        gpu,
        device=options.device,
        settings=CAMPAIGN_SETTINGS,
        trial_timeout_s=15.0,
        compile_workers=workers,
    )


class Campaign:
    """One call's run over an out-dir (see the module doc)."""

    def __init__(self, options: CampaignOptions, log: Callable[[str], None]):
        self.options = options
        self.out = options.out_dir
        self.simulated = options.runner == "simulated"
        self.operators = resolve_operators(options.operators)
        self.families = families_of(self.operators)
        self.costs = GpuSideCosts()
        self.deadline = Deadline(options.minutes, self.costs.reserve)
        self._log = log
        self.packer = Packer(self.out, options.pack)
        self.previous: dict[str, Any] = {}
        # The --have folder, checked (open_have) but copied into the out-dir only once the
        # device is known to be its GPU (adopt), and whether this call wrote anything there.
        self.have: Path | None = None
        self.have_probe: dict[str, Any] | None = None
        self.adopted = False
        self.wrote = False
        self.created_out = False
        self.gpu_key: str | None = None
        self.device_name: str | None = None
        self.sweeps: dict[str, Any] | None = None
        self.state, self.reason = "running", None
        self.quarantine: str | None = None  # what a quarantine left out of the sweeps
        self.call: dict[str, Any] = {
            "started": _now(),
            "minutes": options.minutes,
            "command": list(options.command),
            "host": platform.node(),
            "python": platform.python_version(),
            "phases": [],
        }

    def log(self, line: str) -> None:
        self._log(f"[{self.deadline.elapsed():6.1f} s] {line}")

    # --- files -----------------------------------------------------------------------

    def path(self, phase: str) -> Path:
        return self.out / layout.PHASE_FILES[phase]

    def read(self, phase: str) -> dict[str, Any] | None:
        return layout.read_json(self.path(phase))

    def phase_record(self, phase: str, status: str, started: float, **extra: Any) -> None:
        seconds = round(time.perf_counter() - started, 3)
        self.call["phases"].append({"phase": phase, "status": status, "seconds": seconds, **extra})
        self.log(f"{phase}: {status} ({seconds:.1f} s)")

    def to_sweep(self) -> list[str]:
        """The operators whose sweeps are wanted: all but those a quarantine skipped."""
        from pipetune.workers.campaign.correctness import skips

        correctness = self.read("correctness") if self.path("correctness").exists() else None
        return [op for op, w in self.operators.items() if not skips(correctness, w)]

    def overall(self, wanted: list[str]) -> dict[str, str]:
        """Each phase's status; ``wanted``: the operators whose sweeps are wanted (to_sweep)."""
        from pipetune.workers.campaign.correctness import checked_families

        status = {}
        for phase in ("probe", "correctness", "profile"):
            doc = self.read(phase) if self.path(phase).exists() else None
            status[phase] = "done" if doc is not None else "missing"
        correctness = self.read("correctness") if self.path("correctness").exists() else None
        if correctness is not None and set(self.families) - set(checked_families(correctness)):
            status["correctness"] = "partial"  # a family these operators need is unchecked
        if status["probe"] == "done" and (self.read("probe") or {}).get("verdict") != "pass":
            status["probe"] = "failed"
        baselines = self.read("baselines") or {}
        got = set(baselines.get("operators", {}))
        status["baselines"] = (
            "done" if got >= set(self.operators) else "partial" if got else "missing"
        )
        done = [op for op in wanted if layout.sweep_path(self.out, op).exists()]
        started = [op for op in wanted if layout.parts_present(self.out, op)]
        status["sweeps"] = (
            "done" if len(done) == len(wanted) else "partial" if done or started else "missing"
        )
        return status

    def summary(self) -> dict[str, Any]:
        wanted = self.to_sweep()
        phases = self.overall(wanted)
        # The sweeps phase's own counts; an operator an earlier call left in parts that this
        # call has not reached (it paused or stopped before the sweeps) is partial too, by
        # its parts, or it would be in none of done, partial and left.
        partial = dict((self.sweeps or {}).get("partial", {}))
        for op in wanted:
            present = layout.parts_present(self.out, op)
            if op not in partial and present and not layout.sweep_path(self.out, op).exists():
                partial[op] = {"parts": len(present)}
        sweeps = {
            "done": [op for op in self.operators if layout.sweep_path(self.out, op).exists()],
            "partial": partial,
            "left": [
                op
                for op in wanted
                if not layout.sweep_path(self.out, op).exists()
                and not layout.parts_present(self.out, op)
            ],
            "quarantined": (self.sweeps or {}).get("quarantined", {}),
            "skipped": [op for op in self.operators if op not in wanted],
        }
        return {
            "format": FORMAT,
            "runner": self.options.runner,
            "simulated": self.simulated,
            "gpu": self.gpu_key,
            "device_name": self.device_name,
            "operators": list(self.operators),
            "settings": CAMPAIGN_SETTINGS.as_dict(),
            "state": self.state,
            "reason": self.reason,
            "quarantine": self.quarantine,
            "phases": phases,
            "sweeps": sweeps,
            "calls": [*self.previous.get("calls", []), self.call],
            "files": layout.members(self.out),
            **(
                {"note": "SIMULATED: no GPU ran; every number is the analytical model's"}
                if self.simulated
                else {}
            ),
        }

    def checkpoint(self, wait: bool = False) -> None:
        """Write the summary and refresh the archive (``wait``: until the archive holds it,
        so that a call killed during the next sweep part loses only that part)."""
        self.call["seconds"] = round(self.deadline.elapsed(), 3)
        self.wrote = True
        layout.write_json(self.out / layout.SUMMARY_FILE, self.summary())
        if wait:
            self.packer.flush()
        else:
            self.packer.request()

    # --- the run ------------------------------------------------------------------------

    def open_have(self, scratch: Path) -> None:
        """Check the --have before anything is made, measured or copied: its documents are
        JSON objects, its runner is this call's, and its GPU the --gpu named (without --gpu
        the device decides: check_have_gpu once it is known)."""
        if self.options.have is None:
            return
        try:
            have = layout.open_have(self.options.have, scratch / "have")
            documents = layout.check_documents(have, str(self.options.have))
        except layout.LayoutError as exc:
            raise CampaignUsageError(f"--have: {exc}") from None
        self.have, self.previous = have, documents.get(layout.SUMMARY_FILE, {})
        self.have_probe = documents.get(layout.PHASE_FILES["probe"])
        self.continue_earlier_operators()
        probe = self.have_probe
        if probe is not None and probe.get("runner") != self.options.runner:
            raise CampaignUsageError(
                f"--have holds a {probe.get('runner')} campaign; a {self.options.runner} "
                "campaign cannot continue it (simulated and measured data never mix)"
            )
        if self.options.gpu is not None:
            key = resolve_gpu_key(self.options.gpu)
            self.check_have_gpu(key, f"--gpu names {key}")

    def continue_earlier_operators(self) -> None:
        """The --have's campaign goes on whole: the operators its calls named come first, in
        their order, then this call's new ones. A call naming fewer left the earlier ones
        out of its summary and said "complete" of a campaign with unswept operators (and
        the kit then offered no call to finish them)."""
        earlier = self.previous.get("operators") or []
        if not isinstance(earlier, list) or not all(isinstance(op, str) for op in earlier):
            raise CampaignUsageError(
                "--have: its campaign.json's operators are not a list of names"
            )
        if not earlier:
            return
        try:
            merged = resolve_operators(",".join(earlier))
        except ValueError as exc:
            raise CampaignUsageError(f"--have: its campaign's operators: {exc}") from None
        if set(merged) <= set(self.operators):
            return
        merged.update(self.operators)
        self.operators = merged
        self.families = families_of(self.operators)

    def check_have_gpu(self, key: str, this: str) -> None:
        """CampaignUsageError where the --have was measured on another GPU model than ``key``
        (``this`` says where key came from)."""
        probe = self.have_probe
        if probe is None or probe.get("gpu") == key:
            return
        device = probe.get("device")
        name = device.get("name") if isinstance(device, dict) else None
        raise CampaignUsageError(
            f"--have was measured on {probe.get('gpu')} ({name}), {this}: a campaign stays "
            "on one GPU model"
        )

    def adopt(self) -> None:
        """Copy the checked --have's files into the out-dir (this call's archive then holds
        everything so far)."""
        if self.have is None or self.adopted:
            return
        names = layout.adopt(self.have, self.out)
        self.adopted = self.wrote = True
        self.log(f"--have: {len(names)} files from {self.options.have}")

    def run(self, scratch: Path) -> None:
        self.open_have(scratch)
        self.created_out = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        stand_in = self.options.gpu if self.simulated else None
        library = LibraryChild(self.options.runner, self.options.device, stand_in)
        try:
            device = library.call(library.side.describe)
            self.device_name = device["name"]
            self.gpu_key = resolve_device_gpu(device["name"], self.options.gpu, self.simulated)
            # Before the copy: a refused --have leaves none of its files in the out-dir.
            self.check_have_gpu(self.gpu_key, f"this device is {self.gpu_key} ({self.device_name})")
            self.adopt()
            probe_had = self.read("probe")
            checks = library.call(library.side.library_checks, timeout_s=300)
            failed = [name for name in REQUIRED_CHECKS if not checks.get(name, {}).get("ok")]
            gpu = get_gpu(self.gpu_key)
            self.log(f"probe: {self.device_name} ({self.gpu_key}); checks {checks_line(checks)}")
            if failed:
                self.write_probe(device, checks, None, "fail")
                self.phase_record("probe", "failed", started, failed=failed)
                first = checks.get(failed[0], {})
                raise CampaignError(
                    f"probe: {', '.join(failed)} failed ({first.get('error') or first}); "
                    "nothing else can be trusted on this machine"
                )
            runner = open_runner(self.options, gpu)
            try:
                floor = runner.measure_floor()
                self.call.update(device_name=self.device_name, timing_floor_us=floor, checks=checks)
                if probe_had is None or probe_had.get("verdict") != "pass":
                    self.write_probe(device, checks, floor, "pass", runner=runner, gpu=gpu)
                    self.phase_record("probe", "done", started, file="probe.json")
                else:
                    self.phase_record("probe", "skipped (--have)", started, timing_floor_us=floor)
                self.checkpoint()
                self.after_probe(runner, library, gpu)
            finally:
                runner.close()
        finally:
            library.close()

    def write_probe(
        self,
        device: dict[str, Any],
        checks: dict[str, Any],
        floor: float | None,
        verdict: str,
        runner: KernelRunner | None = None,
        gpu: GPUSpec | None = None,
    ) -> None:
        spec = gpu or get_gpu(self.gpu_key or "h100")
        differs = {
            field: {"device": device.get(field), "spec": getattr(spec, spec_field)}
            for field, spec_field in (("sm_count", "sm_count"), ("l2_bytes", "l2_bytes"))
            if device.get(field) is not None and device.get(field) != getattr(spec, spec_field)
        }
        layout.write_json(
            self.path("probe"),
            {
                "runner": self.options.runner,
                "simulated": self.simulated,
                "gpu": self.gpu_key,
                "verdict": verdict,
                "date": _now(),
                "device": device,
                "checks": checks,
                "timing_floor_us": floor,
                "timing_floor": "an empty kernel (1 block, 32 threads) timed as every trial is: "
                "flush, event, launch, event; median of the repeats",
                "settings": CAMPAIGN_SETTINGS.as_dict(),
                "runner_device": None if runner is None else runner.device,
                "compiler": compiler_versions(),
                "spec_differs": differs,
                **({"note": "SIMULATED: no GPU was probed"} if self.simulated else {}),
            },
        )

    def after_probe(self, runner: KernelRunner, library: LibraryChild, gpu: GPUSpec) -> None:
        # correctness: the families of this call's operators; a --have document that lacks
        # one (an earlier call swept other operators) gets it checked and merged in.
        from pipetune.workers.campaign.correctness import (
            checked_families,
            merge,
            quarantine_note,
            quarantined_features,
            run_correctness,
            stop_reason,
        )

        correctness = self.read("correctness")
        started = time.perf_counter()
        missing = list(self.families)
        if correctness is not None:
            have = checked_families(correctness)
            missing = [name for name in self.families if name not in have]
            if correctness["verdict"] == "stop":
                missing = []  # a stopped campaign stays stopped: nothing more is checked
        if missing:
            if not self.deadline.allows(self.costs.correctness_s(missing)):
                return self.pause("deadline before the correctness phase")
            checked = run_correctness(runner, gpu, missing)
            correctness = checked if correctness is None else merge(correctness, checked)
            layout.write_json(self.path("correctness"), correctness)
            self.phase_record(
                "correctness",
                correctness["verdict"],
                started,
                file="correctness.json",
                families=missing,
                schedules=checked["schedules"],
                failed=checked["failed"],
            )
            self.checkpoint()
        else:
            self.phase_record("correctness", "skipped (--have)", started)
        assert correctness is not None
        reason = stop_reason(correctness)
        if reason is not None:
            self.state, self.reason = "stopped", reason
            raise CampaignError(self.reason)
        self.quarantine = quarantine_note(correctness)
        if self.quarantine is not None:
            self.log(self.quarantine)
        left_out = quarantined_features(correctness)

        # profile
        from pipetune.workers.calibrate import CalibrationError
        from pipetune.workers.campaign.profile_phase import run_profile

        started = time.perf_counter()
        if self.read("profile") is None:
            if not self.deadline.allows(self.costs.profile):
                return self.pause("deadline before the profile phase")
            try:
                profile = run_profile(
                    gpu.key,
                    simulated=self.simulated,
                    device=self.options.device,
                    timing_floor_us=self.call.get("timing_floor_us"),
                )
                layout.write_json(self.path("profile"), profile)
                self.phase_record("profile", "done", started, file="profile.json")
            except CalibrationError as exc:  # the sweeps do not need it: record and go on
                self.phase_record("profile", "failed", started, error=str(exc))
            self.checkpoint()
        else:
            self.phase_record("profile", "skipped (--have)", started)

        # baselines
        from pipetune.workers.campaign import baselines
        from pipetune.workers.campaign.baselines import run_baselines

        started = time.perf_counter()
        document = self.read("baselines") or {
            "runner": self.options.runner,
            "simulated": self.simulated,
            "gpu": gpu.key,
            "device_name": self.device_name,
            "settings": CAMPAIGN_SETTINGS.as_dict(),
            "timing": "as the kernel runner times kernels (workers.runners.timing): a flush of "
            ">= 2x L2 before each timed launch, an event pair around it, median of the repeats; "
            "entries marked timing: held also had a spin kernel between the flush and the "
            "start event, so the library call's host dispatch is not timed",
            "timing_floor_us": self.call.get("timing_floor_us"),
            "operators": {},
        }
        before = len(document["operators"])
        if baselines.missing(document, self.operators):

            def save(doc: dict[str, Any]) -> None:
                layout.write_json(self.path("baselines"), doc)
                self.checkpoint()

            complete = run_baselines(
                library.worker,
                library.side,
                self.operators,
                document,
                self.deadline,
                save,
                self.costs,
                self.log,
            )
            self.phase_record(
                "baselines",
                "done" if complete else "partial",
                started,
                file="baselines.json",
                operators=len(document["operators"]) - before,
            )
            if not complete:
                return self.pause("deadline during the baselines phase")
        else:
            self.phase_record("baselines", "skipped (--have)", started)

        # sweeps
        from pipetune.workers.campaign.sweeps import run_sweeps

        started = time.perf_counter()

        def sweep_checkpoint(progress: Any) -> None:
            self.sweeps = progress.as_dict()
            self.checkpoint(wait=True)

        try:
            progress = run_sweeps(
                runner,
                gpu,
                self.operators,
                self.out,
                self.deadline,
                sweep_checkpoint,
                self.costs,
                self.log,
                left_out,
            )
        except layout.LayoutError as exc:  # parts in --have that this version cuts otherwise
            raise CampaignUsageError(f"--have: {exc}") from None
        self.sweeps = progress.as_dict()
        status = "done" if progress.stopped is None else "partial"
        if progress.parts_measured == 0 and progress.stopped is None:
            status = "skipped (--have)"
        self.phase_record(
            "sweeps",
            status,
            started,
            parts=progress.parts_measured,
            done=progress.done,
            stopped=progress.stopped,
            part_seconds=progress.part_seconds,
        )
        if progress.stopped is not None:
            return self.pause(progress.stopped)
        self.state = "complete"
        return None

    def finish(self, exit_code: int) -> bool:
        """Write the summary, whatever happened: a call that broke still packs everything so
        far (the --have's files too). A usage mistake found before this call wrote anything
        (a --have of another GPU model) leaves the out-dir and the archive as they were, so
        that the corrected command can run into them. Whether the summary was written."""
        if not self.out.is_dir():
            return False
        if exit_code == 2 and not self.wrote:
            if self.created_out:
                with contextlib.suppress(OSError):  # (never a folder that holds anything)
                    self.out.rmdir()
            return False
        if exit_code != 2:
            self.adopt()
        self.checkpoint()
        return True

    def pause(self, reason: str) -> None:
        self.state, self.reason = "paused", reason
        self.log(f"paused: {reason}")


def compiler_versions() -> dict[str, str | None]:
    """The NVRTC that compiles pipetune's kernels (cuda-bindings over the nvidia-cuda-nvrtc
    wheel, in this process; CuPy's own NVRTC is in the device description)."""
    versions: dict[str, str | None] = {}
    try:
        from pipetune.workers.compile import nvrtc_version

        versions["nvrtc"] = ".".join(str(v) for v in nvrtc_version())
    except Exception as exc:  # recorded, not fatal: the runner fails clearly if it matters
        versions["nvrtc"] = None
        versions["nvrtc_error"] = f"{type(exc).__name__}: {exc}"
    for package in ("cuda-bindings", "nvidia-cuda-nvrtc"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def checks_line(checks: dict[str, Any]) -> str:
    return ", ".join(f"{name} {'ok' if c.get('ok') else 'FAILED'}" for name, c in checks.items())


def run_campaign(
    options: CampaignOptions, log: Callable[[str], None] | None = None
) -> CampaignOutcome:
    """Run one call of a campaign; the outcome (usage mistakes raise CampaignUsageError
    before anything is written)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    check_options(options)
    campaign = Campaign(options, log)
    exit_code, message, wrote = 0, "", False
    with tempfile.TemporaryDirectory(prefix="pipetune-campaign-") as scratch:
        try:
            campaign.run(Path(scratch))
            message = campaign.reason or "complete"
            if campaign.quarantine is not None:
                message = f"{message}; {campaign.quarantine}"
        except CampaignUsageError as exc:
            campaign.state, campaign.reason = "failed", str(exc)
            exit_code, message = 2, str(exc)
        except (CampaignError, RunnerError) as exc:
            if campaign.state == "running":
                campaign.state, campaign.reason = "failed", str(exc)
            exit_code, message = 1, str(exc)
        except Exception as exc:  # recorded in campaign.json, so the archive says why
            campaign.state = "failed"
            campaign.reason = f"{type(exc).__name__}: {exc}"
            exit_code, message = 1, campaign.reason
        finally:
            campaign.call["ended"] = _now()
            wrote = campaign.finish(exit_code)
            campaign.packer.close(final=wrote)
    if campaign.packer.error:
        exit_code, message = 1, campaign.packer.error
    elif campaign.packer.size is not None and campaign.packer.size > layout.PACK_LIMIT_BYTES:
        exit_code = 1
        message = (
            f"{options.pack} is {campaign.packer.size / 2**20:.1f} MiB, over the "
            f"{layout.PACK_LIMIT_BYTES / 2**20:.0f} MiB a device call brings back"
        )
    summary = (layout.read_json(campaign.out / layout.SUMMARY_FILE) if wrote else None) or {}
    return CampaignOutcome(exit_code, campaign.state, message, summary, campaign.packer.size)
