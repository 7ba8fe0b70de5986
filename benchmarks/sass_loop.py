"""The instructions of a compiled kernel's main loop, read from its SASS (nvdisasm from the
`nvidia-cuda-nvdisasm` wheel; no GPU): what model/issue.py's counts are checked against.

The main loop is the code between the targets and the sources of the backward branches
that enclose the `mma.sync`s (HMMA) of the K-tile loop, joined while they overlap: the loop
body with its copy path (the last S-1 steps branch around their copies, so each path is
counted once).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^(\.L\w+):")
BRANCH = re.compile(r"\bBRA\s+(?:`\((\.L\w+)\)|(0x[0-9a-f]+))")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


class NoDisassemblerError(RuntimeError):
    pass


def nvdisasm() -> str:
    """The nvdisasm executable: on PATH, or the one the `nvidia-cuda-nvdisasm` wheel installs."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia.cu13  # type: ignore[import-not-found]  # the CUDA 13 wheels' namespace
    except ImportError:
        nvidia_paths: list[str] = []
    else:
        nvidia_paths = list(nvidia.cu13.__path__)
    for root in nvidia_paths:
        candidate = Path(root) / "bin" / "nvdisasm"
        if candidate.is_file():
            return str(candidate)
    raise NoDisassemblerError("nvdisasm not found: pip install 'nvidia-cuda-nvdisasm>=13,<14'")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()[:500]}")
    return done.stdout


@dataclass(frozen=True)
class LoopCounts:
    total: int
    mma: int  # HMMA (mma.sync)
    ldmatrix: int  # LDSM
    copies: int  # LDGSTS (cp.async)

    @property
    def integer(self) -> int:
        return self.total - self.mma - self.ldmatrix - self.copies

    def per_step(self, mma_per_step: float) -> LoopCounts:
        """The counts of one K step, where the compiler unrolled the loop (a loop of one
        stage is unrolled twice): the mma count of a step is known exactly, so the unroll
        factor is the loop's mma count over it."""
        unroll = round(self.mma / mma_per_step)
        if unroll < 1 or unroll * mma_per_step != self.mma:
            raise ValueError(f"{self.mma} mma in the loop is not a whole number of K steps")
        return LoopCounts(
            *(x // unroll for x in (self.total, self.mma, self.ldmatrix, self.copies))
        )


def _opcode(text: str) -> str:
    return PREDICATE.sub("", text).split()[0].split(".")[0]


def main_loop_counts(sass: str) -> LoopCounts:
    """Instruction counts of the K-tile loop of the (one) kernel in `sass`."""
    instructions: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in sass.splitlines():
        label = LABEL.match(line.strip())
        if label:
            pending.append(label.group(1))
            continue
        m = INSTRUCTION.match(line)
        if m:
            address = int(m.group(1), 16)
            for name in pending:
                labels[name] = address
            pending = []
            instructions.append((address, m.group(2)))
    backward = []
    for address, text in instructions:
        b = BRANCH.search(text)
        if b:
            target = labels[b.group(1)] if b.group(1) else int(b.group(2), 16)
            if target < address:
                backward.append((target, address))
    mma_at = [a for a, t in instructions if _opcode(t) == "HMMA"]
    spans = [(lo, hi) for lo, hi in backward if any(lo <= a <= hi for a in mma_at)]
    if not spans:
        raise ValueError("no loop around the mma instructions")
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    grown = True
    while grown:  # join the loops that overlap the span (the copy path branched around)
        grown = False
        for a, b in backward:
            if (lo <= a <= hi or lo <= b <= hi) and (a < lo or b > hi):
                lo, hi, grown = min(lo, a), max(hi, b), True
    ops = collections.Counter(_opcode(t) for a, t in instructions if lo <= a <= hi)
    return LoopCounts(
        total=sum(ops.values()), mma=ops["HMMA"], ldmatrix=ops["LDSM"], copies=ops["LDGSTS"]
    )


def sample_step_counts(space, sample: int, seed: int, arch: str = "sm_90") -> list[tuple]:
    """A stratified sample of `space` compiled by NVRTC for `arch`: (row of the space, its
    schedule, the SASS counts of one K step) per kernel, in the sample's order."""
    from pipetune.model.family import family_of
    from pipetune.model.issue import step_instructions
    from pipetune.workers.codegen.sample import stratified_sample
    from pipetune.workers.compile import compile_many
    from pipetune.workers.families import codegen_for

    workload = space.workload
    schedules = stratified_sample(space, sample, seed=seed)
    generate = codegen_for(family_of(workload)).generate
    results = compile_many([generate(workload, s) for s in schedules], arch)
    mma = step_instructions(space).mma
    counts = []
    for schedule, result in zip(schedules, results, strict=True):
        i = space.index(schedule)
        counts.append((i, schedule, main_loop_counts(disassemble(result.cubin)).per_step(mma[i])))
    return counts
