"""Memory-intensive operators on the rows of a 2-D tensor (the AStitch family's workloads).

Every operator reads ``x`` of shape rows × cols (row-major, of the workload's ``dtype``:
float16, the default, or bfloat16; the output and the parameter vectors are of the same type)
and works along the last dimension, accumulating in float32:

- ``reduce``: out[r] = Σ_c x[r, c] (``reduction="sum"``) or max_c x[r, c] (``"max"``);
  the output has one value per row.
- ``softmax``: y[r, :] = exp(x[r, :] − max) / Σ exp(x[r, :] − max).
- ``layernorm``: y[r, :] = (x[r, :] − mean) / sqrt(var + eps) · gamma + beta, with gamma
  and beta vectors of length cols and the biased variance (as PyTorch).
- ``rmsnorm``: y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · gamma, gamma a vector
  of length cols (the root-mean-square norm of LLaMA-style decoders; as PyTorch's
  ``nn.functional.rms_norm``, the whole product in float32, rounded once).
- ``bias_gelu``: y[r, c] = gelu(x[r, c] + bias[c]), a stitched element-wise chain (bias
  add then GELU, one read and one write); ``approximate`` as PyTorch's ``nn.GELU``:
  ``"none"`` is the erf form (BERT), ``"tanh"`` the tanh approximation (GPT-2).
- ``silu_mul``: y[r, c] = silu(x[r, c]) · x[r, cols + c], the SwiGLU between a LLaMA-style
  MLP's GEMMs: x is rows × 2·cols, the gate and up projections side by side as one GEMM of
  both weights writes them (vLLM's ``silu_and_mul`` layout), y is rows × cols.

Limits, and why (a bad field raises WorkloadError naming it, as the GEMM workloads do):
- rows and cols are strict positive integers (a float or a string is a mistake);
- cols is a multiple of 8: the widest vector load is 8 16-bit elements (16 bytes) and every
  row must start 16-byte aligned;
- cols <= 2^20 and rows <= 2^24: no operator of a real network comes near them;
- rows · cols < 2^31 (silu_mul: rows · 2·cols): the kernels index elements with 32-bit
  ints.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from pipetune.model.plain_numbers import PLAIN_INTEGER
from pipetune.model.workloads import (
    DTYPES,
    INDEX_LIMIT,
    DType,
    GeluForm,
    WorkloadError,
    dtype_suffix,
    parse_tagged,
)

FLOAT32_TINY = 2.0**-126  # float32's smallest normal number

ROW_ALIGN = 8  # 16-bit elements per 16-byte vector: rows start 16-byte aligned
MAX_ROWS = 1 << 24
MAX_COLS = 1 << 20
BYTES_FP16 = 2  # per element, float16 and bfloat16 alike

Rows = Annotated[
    int,
    PLAIN_INTEGER,
    Field(strict=True, ge=1, le=MAX_ROWS, description="rows (independent tasks)"),
]
Cols = Annotated[
    int,
    PLAIN_INTEGER,
    Field(
        strict=True,
        ge=ROW_ALIGN,
        le=MAX_COLS,
        description="columns: the reduced (last) dimension, a multiple of 8",
    ),
]


class _RowWorkload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # The tensor-core family's element types (model/workloads.py DType): a bfloat16 workload
    # is another workload (its hash and label differ), float16's documents are unchanged.
    dtype: DType = Field(
        default="float16",
        description="element type of input and output: float16 or bfloat16 (float32 arithmetic)",
    )
    rows: Rows
    cols: Cols

    @model_validator(mode="after")
    def _validate(self) -> _RowWorkload:
        if self.cols % ROW_ALIGN:
            raise WorkloadError(
                "cols",
                f"must be a multiple of {ROW_ALIGN} for 16-bit elements (rows start 16-byte "
                f"aligned for the 16-byte vector loads), got {self.cols}",
            )
        elements = self.rows * self.row_inputs * self.cols
        if elements > INDEX_LIMIT:
            width = "cols" if self.row_inputs == 1 else f"{self.row_inputs} x cols"
            raise WorkloadError(
                "rows",
                f"rows x {width} = {elements} elements exceed the 2^31-1 limit of 32-bit "
                "kernel indexing",
            )
        return self

    # What every operator of the family reads and writes, as stored.
    @property
    def has_output_pass(self) -> bool:
        """Whether the row is read a second time to write a full-size output (softmax,
        layernorm): the row is kept (registers, shared memory) or re-read between passes."""
        return False

    @property
    def has_reduction(self) -> bool:
        return True

    @property
    def param_vectors(self) -> int:
        """Vectors of length cols the operator reads besides x (bias, gamma, beta)."""
        return 0

    @property
    def row_inputs(self) -> int:
        """Values of x an output column reads per row: x is rows x row_inputs·cols."""
        return 1

    @property
    def output_elements(self) -> int:
        return self.rows * self.cols

    @property
    def input_bytes(self) -> int:
        return BYTES_FP16 * self.cols * (self.rows * self.row_inputs + self.param_vectors)

    @property
    def output_bytes(self) -> int:
        return BYTES_FP16 * self.output_elements

    @property
    def compulsory_bytes(self) -> int:
        """DRAM traffic with perfect reuse: read every input once, write the output once."""
        return self.input_bytes + self.output_bytes

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def workload_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def dtype_suffix(self) -> str:
        """What a label adds for the element type (model/workloads.py's rule)."""
        return dtype_suffix(self.dtype)

    def label(self) -> str:
        return f"{self.op} {self.rows}x{self.cols}{self.dtype_suffix()}"  # type: ignore[attr-defined]


class Reduce(_RowWorkload):
    """Row reduction: out[r] = sum or max of x[r, :] (one value per row; a row holding a
    NaN gives NaN, as torch.sum and torch.amax do)."""

    op: Literal["reduce"] = "reduce"
    reduction: Literal["sum", "max"] = Field(default="sum", description="sum or max")

    @property
    def output_elements(self) -> int:
        return self.rows

    def label(self) -> str:
        return f"reduce-{self.reduction} {self.rows}x{self.cols}{self.dtype_suffix()}"


class Softmax(_RowWorkload):
    """Row softmax: y = exp(x - max) / sum(exp(x - max)) along the last dimension."""

    op: Literal["softmax"] = "softmax"

    @property
    def has_output_pass(self) -> bool:
        return True


class NormWorkload(_RowWorkload):
    """A normalisation of each row: a statistic pass, then an output pass scaled by
    1 / sqrt(statistic + eps) and gamma (layernorm, rmsnorm)."""

    eps: float = Field(
        default=1e-5,
        strict=True,
        allow_inf_nan=False,  # (NaN was refused as "should be <= 1", its first failed bound)
        gt=0.0,
        le=1.0,
        description="added to the variance (layernorm) or the mean square (rmsnorm)",
    )

    @model_validator(mode="after")
    def _eps_in_float32(self) -> NormWorkload:
        # The kernels add eps in float32: below its smallest normal number it would become a
        # subnormal or 0 there (1e-300 was accepted, labelled "eps=1e-300", and computed as 0).
        if self.eps < FLOAT32_TINY:
            raise WorkloadError(
                "eps",
                f"must be at least {FLOAT32_TINY:.9g} (float32's smallest normal number: the "
                f"kernels compute in float32), got {self.eps:g}",
            )
        return self

    @property
    def has_output_pass(self) -> bool:
        return True

    def label(self) -> str:
        suffix = self.dtype_suffix()
        return f"{self.op} {self.rows}x{self.cols} eps={self.eps:g}{suffix}"  # type: ignore[attr-defined]


class LayerNorm(NormWorkload):
    """Layer normalisation of each row, with gamma and beta of length cols."""

    op: Literal["layernorm"] = "layernorm"

    @property
    def param_vectors(self) -> int:
        return 2


class RMSNorm(NormWorkload):
    """Root-mean-square normalisation of each row, with gamma of length cols (no mean
    subtracted, no beta)."""

    op: Literal["rmsnorm"] = "rmsnorm"

    @property
    def param_vectors(self) -> int:
        return 1


class BiasGelu(_RowWorkload):
    """Stitched element-wise chain: y = gelu(x + bias), bias of length cols."""

    op: Literal["bias_gelu"] = "bias_gelu"
    approximate: GeluForm = "none"

    @property
    def has_reduction(self) -> bool:
        return False

    @property
    def param_vectors(self) -> int:
        return 1

    def label(self) -> str:
        return f"bias_gelu({self.approximate}) {self.rows}x{self.cols}{self.dtype_suffix()}"


class SiluMul(_RowWorkload):
    """SwiGLU's gating: y = silu(gate) · up, gate and up the two halves of each row of x
    (rows x 2·cols; y is rows x cols)."""

    op: Literal["silu_mul"] = "silu_mul"

    @property
    def has_reduction(self) -> bool:
        return False

    @property
    def row_inputs(self) -> int:
        return 2


MemWorkload = Reduce | Softmax | LayerNorm | RMSNorm | BiasGelu | SiluMul
MEM_OPS: dict[str, type[_RowWorkload]] = {
    "reduce": Reduce,
    "softmax": Softmax,
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "bias_gelu": BiasGelu,
    "silu_mul": SiluMul,
}
# One integer per operator (and reduction kind) for the kernels and the cost model.
OP_CODES: dict[str, int] = {"reduce-sum": 0, "reduce-max": 1, "softmax": 2, "layernorm": 3,
                            "bias_gelu": 4, "rmsnorm": 5, "silu_mul": 6}  # fmt: skip
_ADAPTER: TypeAdapter[MemWorkload] = TypeAdapter(Annotated[MemWorkload, Field(discriminator="op")])


def op_key(workload: MemWorkload) -> str:
    """The operator as the kernels distinguish it: reduce splits into sum and max."""
    return f"reduce-{workload.reduction}" if isinstance(workload, Reduce) else workload.op


def parse_mem_workload(data: dict[str, Any]) -> MemWorkload:
    """A memory-intensive workload from a plain dict; WorkloadError names the bad field."""
    return parse_tagged(  # type: ignore[no-any-return]
        data, MEM_OPS, _ADAPTER, "the memory-intensive kernels", dtypes=DTYPES
    )


def reduce(rows: int, cols: int, reduction: str = "sum") -> Reduce:
    return parse_mem_workload({"op": "reduce", "rows": rows, "cols": cols, "reduction": reduction})  # type: ignore[return-value]


def softmax(rows: int, cols: int) -> Softmax:
    return parse_mem_workload({"op": "softmax", "rows": rows, "cols": cols})  # type: ignore[return-value]


def layernorm(rows: int, cols: int, eps: float = 1e-5) -> LayerNorm:
    return parse_mem_workload({"op": "layernorm", "rows": rows, "cols": cols, "eps": eps})  # type: ignore[return-value]


def rmsnorm(rows: int, cols: int, eps: float = 1e-5) -> RMSNorm:
    return parse_mem_workload({"op": "rmsnorm", "rows": rows, "cols": cols, "eps": eps})  # type: ignore[return-value]


def bias_gelu(rows: int, cols: int, approximate: str = "none") -> BiasGelu:
    data = {"op": "bias_gelu", "rows": rows, "cols": cols, "approximate": approximate}
    return parse_mem_workload(data)  # type: ignore[return-value]


def silu_mul(rows: int, cols: int) -> SiluMul:
    return parse_mem_workload({"op": "silu_mul", "rows": rows, "cols": cols})  # type: ignore[return-value]
