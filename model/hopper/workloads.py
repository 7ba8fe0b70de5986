"""The Hopper family's workloads: the GEMM and batched GEMM of the tensor-core family, computed
by a warpgroup-MMA kernel (``wgmma.mma_async``, tiles loaded by the TMA unit) that only Hopper
GPUs (sm_90) run.

They are the tensor-core family's `Gemm` (B stored K x N) and `Bmm` under op names of their own:
an op name picks its kernel family (model/family.py), and these shapes are computed by another
kernel, with other knobs and another model. Everything else (operand layout, alignment, the
reference check, FLOPs) is the same, so the two families' kernels on one shape are compared by
the same numbers.
"""

from __future__ import annotations

import reprlib
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from pipetune.model.workloads import Bmm, Gemm, WorkloadError


class HopperGemm(Gemm):
    """C[M,N] = A[M,K] @ B[K,N], row-major, on warpgroup MMA."""

    op: Literal["hopper_gemm"] = "hopper_gemm"  # type: ignore[assignment]
    # The TMA loader reads B as K x N row-major tiles (its tensor map's layout).
    b_layout: Literal["kn"] = "kn"

    def label(self) -> str:
        return f"hopper_gemm {self.m}x{self.n}x{self.k}"


class HopperBmm(Bmm):
    """b independent M x K @ K x N products on warpgroup MMA."""

    op: Literal["hopper_bmm"] = "hopper_bmm"  # type: ignore[assignment]

    def label(self) -> str:
        return f"hopper_bmm {self.b}x{self.m}x{self.n}x{self.k}"


HopperWorkload = HopperGemm | HopperBmm
HOPPER_OPS: dict[str, type[HopperGemm] | type[HopperBmm]] = {
    str(cls.model_fields["op"].default): cls for cls in (HopperGemm, HopperBmm)
}
# The tensor-core family's op each one computes, and back (what a kernel of either family on
# one shape is compared on).
TENSOR_OP = {"hopper_gemm": "gemm", "hopper_bmm": "bmm"}
_ADAPTER: TypeAdapter[HopperWorkload] = TypeAdapter(
    Annotated[HopperGemm | HopperBmm, Field(discriminator="op")]
)


def parse_hopper_workload(data: dict[str, Any]) -> HopperWorkload:
    """A Hopper workload from a plain dict; WorkloadError names the bad field."""
    if not isinstance(data, dict):
        raise WorkloadError("workload", "must be an object with an 'op' field")
    op = data.get("op")
    if not isinstance(op, str) or op not in HOPPER_OPS:
        raise WorkloadError(
            "op", f"unknown operator {reprlib.repr(op)}; known: {', '.join(HOPPER_OPS)}"
        )
    if data.get("dtype", "float16") != "float16":
        raise WorkloadError(
            "dtype",
            f"unsupported dtype {reprlib.repr(data.get('dtype'))}: the wgmma kernels take "
            "float16 inputs",
        )
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in HOPPER_OPS:  # the discriminated union puts the op tag first
            loc = loc[1:]
        ctx_error = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_error, WorkloadError):
            raise ctx_error from None
        reason = err.get("msg", "invalid")
        if "input" in err and err.get("type") != "missing":
            reason = f"{reason} (got {reprlib.repr(err['input'])})"
        raise WorkloadError(".".join(loc) or "workload", reason) from None


def as_hopper(workload: Gemm | Bmm) -> HopperWorkload:
    """The Hopper family's workload of a tensor-core GEMM (B stored K x N) or BMM."""
    data = workload.canonical()
    if data["op"] == "gemm" and data.get("b_layout") != "kn":
        raise WorkloadError("b_layout", "the wgmma kernels read B stored K x N ('kn')")
    ops = {v: k for k, v in TENSOR_OP.items()}
    if data["op"] not in ops:
        raise WorkloadError("op", f"the wgmma kernels compute gemm and bmm, not {data['op']!r}")
    return parse_hopper_workload({**data, "op": ops[data["op"]]})
