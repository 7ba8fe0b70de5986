"""Parse ptxas's resource report (``--ptxas-options=-v``) out of an NVRTC program log.

ptxas prints, per entry function::

    ptxas info    : Compiling entry function 'name' for 'sm_90'
    ptxas info    : Function properties for name
    ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 94 registers, used 1 barriers, 1024 bytes smem, 364 bytes cmem[0]

("bytes smem" appears only with static shared memory; the dynamic kind is not reported.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipetune.model.errors import PipetuneError

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class ResourceUsage:
    registers: int
    spill_stores_bytes: int
    spill_loads_bytes: int
    stack_bytes: int
    smem_static_bytes: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores_bytes + self.spill_loads_bytes


class ReportMissingError(PipetuneError, ValueError):
    """The log has no ptxas resource report (ptxas -v was not passed, or it changed format)."""


def parse_ptxas_report(log: str) -> dict[str, ResourceUsage]:
    """Resource usage per entry function, in the order ptxas reports them."""
    usage: dict[str, ResourceUsage] = {}
    current: str | None = None
    props: tuple[int, int, int] | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current, props = m.group(1), None
        elif (m := _PROPS.search(line)) and current is not None:
            props = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and current is not None:
            smem = _SMEM.search(line)
            stack, stores, loads = props or (0, 0, 0)
            usage[current] = ResourceUsage(
                registers=int(m.group(1)),
                spill_stores_bytes=stores,
                spill_loads_bytes=loads,
                stack_bytes=stack,
                smem_static_bytes=int(smem.group(1)) if smem else 0,
            )
            current = None
    return usage


def kernel_usage(log: str, name: str | None = None) -> ResourceUsage:
    """The usage of entry ``name``, or the worst case over all entries when name is None."""
    usage = parse_ptxas_report(log)
    if not usage:
        raise ReportMissingError("no ptxas resource report in the compiler log")
    if name is not None:
        if name not in usage:
            raise ReportMissingError(f"ptxas reported no entry function {name!r}")
        return usage[name]
    values = list(usage.values())
    return ResourceUsage(
        registers=max(u.registers for u in values),
        spill_stores_bytes=sum(u.spill_stores_bytes for u in values),
        spill_loads_bytes=sum(u.spill_loads_bytes for u in values),
        stack_bytes=max(u.stack_bytes for u in values),
        smem_static_bytes=max(u.smem_static_bytes for u in values),
    )
