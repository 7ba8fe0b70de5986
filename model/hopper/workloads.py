"""The Hopper family's workloads: the GEMM, batched GEMM and GEMMs with bias + GELU or SwiGLU of
the tensor-core family, computed by a warpgroup-MMA kernel (``wgmma.mma_async``, tiles loaded
by the TMA unit) that only Hopper GPUs (sm_90) run.

They are the tensor-core family's `Gemm` (B stored K x N, or N x K as a PyTorch Linear weight
is), `Bmm`, `GemmBiasGelu` and `GemmSwiglu` under op names of their own: an op name picks its
kernel family (model/family.py), and these shapes are computed by another kernel, with other
knobs and another model. Everything else (operand layout, alignment, the element type: float16
or bfloat16 with fp32 accumulation, the bias and GELU form, the interleaved gate and up
columns, the reference check, FLOPs) is the same, so the two families' kernels on one shape are
compared by the same numbers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from pipetune.model.workloads import (
    DTYPES,
    Bmm,
    Gemm,
    GemmBiasGelu,
    GemmSwiglu,
    WorkloadError,
    parse_tagged,
)


class HopperGemm(Gemm):
    """C[M,N] = A[M,K] @ B, row-major, on warpgroup MMA; B is K×N (b_layout 'kn') or N×K
    ('nk', a transposed weight)."""

    op: Literal["hopper_gemm"] = "hopper_gemm"  # type: ignore[assignment]

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return f"hopper_gemm {self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


class HopperGemmBiasGelu(GemmBiasGelu):
    """C[M,N] = gelu(A @ B + bias) on warpgroup MMA: the GEMM with the bias and GELU applied
    to the f32 accumulators in its staged epilogue (BERT's and GPT-2's FC1 in one kernel)."""

    op: Literal["hopper_gemm_bias_gelu"] = "hopper_gemm_bias_gelu"  # type: ignore[assignment]

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return (
            f"hopper_gemm_bias_gelu({self.approximate}) {self.m}x{self.n}x{self.k}{layout}"
            f"{self.dtype_suffix()}"
        )


class HopperGemmSwiglu(GemmSwiglu):
    """C[M,N] = silu(A @ W_gate) · (A @ W_up) on warpgroup MMA: the gate and up projections as
    one GEMM (B's 2N columns interleaved in groups of 8) whose staged epilogue gates the f32
    accumulators (LLaMA's MLP in one kernel)."""

    op: Literal["hopper_gemm_swiglu"] = "hopper_gemm_swiglu"  # type: ignore[assignment]

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return f"hopper_gemm_swiglu {self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


class HopperBmm(Bmm):
    """b independent M x K @ B products on warpgroup MMA, each B K x N or N x K (b_layout).

    Bmm's validation holds here too, the batch's limit of GRID_Z_LIMIT included: the persistent
    and stream-K kinds walk the batch's tiles in grid x and do not need it, but the one block
    per tile kind puts the batch in grid z, and that kind is the family's baseline, and the
    tensor-core `bmm` of the same shape is what a Hopper kernel is compared with."""

    op: Literal["hopper_bmm"] = "hopper_bmm"  # type: ignore[assignment]

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return f"hopper_bmm {self.b}x{self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


HopperWorkload = HopperGemm | HopperBmm | HopperGemmBiasGelu | HopperGemmSwiglu
HOPPER_OPS: dict[str, type[HopperWorkload]] = {
    str(cls.model_fields["op"].default): cls
    for cls in (HopperGemm, HopperBmm, HopperGemmBiasGelu, HopperGemmSwiglu)
}
# The tensor-core family's op each one computes, and back (what a kernel of either family on
# one shape is compared on).
TENSOR_OP = {
    "hopper_gemm": "gemm",
    "hopper_bmm": "bmm",
    "hopper_gemm_bias_gelu": "gemm_bias_gelu",
    "hopper_gemm_swiglu": "gemm_swiglu",
}
_ADAPTER: TypeAdapter[HopperWorkload] = TypeAdapter(
    Annotated[
        HopperGemm | HopperBmm | HopperGemmBiasGelu | HopperGemmSwiglu, Field(discriminator="op")
    ]
)


def parse_hopper_workload(data: dict[str, Any]) -> HopperWorkload:
    """A Hopper workload from a plain dict; WorkloadError names the bad field."""
    return parse_tagged(  # type: ignore[no-any-return]
        data, HOPPER_OPS, _ADAPTER, "the wgmma kernels", dtypes=DTYPES
    )


def as_hopper(workload: Gemm | Bmm | GemmBiasGelu | GemmSwiglu) -> HopperWorkload:
    """The Hopper family's workload of a tensor-core GEMM (either layout of B), BMM, or GEMM
    with bias + GELU or SwiGLU, of the same element type."""
    data = workload.canonical()
    ops = {v: k for k, v in TENSOR_OP.items()}
    if data["op"] not in ops:
        raise WorkloadError("op", f"the wgmma kernels compute {', '.join(ops)}, not {data['op']!r}")
    return parse_hopper_workload({**data, "op": ops[data["op"]]})
