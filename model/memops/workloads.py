"""Memory-intensive operators on the rows of a 2-D tensor (the AStitch family's workloads).

Every operator reads ``x`` of shape rows × cols (row-major, of the workload's ``dtype``:
float16, the default, or bfloat16; the output and the parameter vectors are of the same type)
and works along the last dimension, accumulating in float32:

- ``reduce``: out[r] = Σ_c x[r, c] (``reduction="sum"``) or max_c x[r, c] (``"max"``);
  the output has one value per row.
- ``softmax``: y[r, :] = exp(z[r, :] − max) / Σ exp(z[r, :] − max), z = ``scale``·x (default 1;
  attention's 1/sqrt(head_dim)). ``causal`` masks each query's later keys, as attention in a
  decoder does: with ``queries`` = L (rows of one attention matrix, default cols), row r is
  query i = r mod L and sees columns c <= i + cols − L (aligned to the last key, as
  FlashAttention's causal mask and a KV-cache decode are); a masked element counts as −inf
  (y = 0 there), and the masked kernels do not read it.
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
import numbers
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
FLOAT32_MAX = float.fromhex("0x1.fffffep+127")  # float32's largest finite number

ROW_ALIGN = 8  # 16-bit elements per 16-byte vector: rows start 16-byte aligned
MAX_ROWS = 1 << 24
MAX_COLS = 1 << 20
BYTES_FP16 = 2  # per element, float16 and bfloat16 alike

# (The Field before the validator, as model/workloads.py's Dim: JSON Schema's bounds.)
Rows = Annotated[
    int,
    Field(strict=True, ge=1, le=MAX_ROWS, description="rows (independent tasks)"),
    PLAIN_INTEGER,
]
Cols = Annotated[
    int,
    Field(
        strict=True,
        ge=ROW_ALIGN,
        le=MAX_COLS,
        description="columns: the reduced (last) dimension, a multiple of 8",
    ),
    PLAIN_INTEGER,
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
    def read_fraction(self) -> float:
        """The share of x the kernels read (a causal softmax skips the keys it hides)."""
        return 1.0

    @property
    def input_bytes(self) -> int:
        x_bytes = BYTES_FP16 * self.cols * self.rows * self.row_inputs
        return round(x_bytes * self.read_fraction) + BYTES_FP16 * self.cols * self.param_vectors

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
    """Row softmax: y = exp(z - max) / sum(exp(z - max)) along the last dimension, z = scale·x
    (attention's 1/sqrt(head_dim)), with keys after each query masked out when causal."""

    op: Literal["softmax"] = "softmax"
    scale: float = Field(
        default=1.0,
        strict=True,
        allow_inf_nan=False,
        gt=0.0,
        description="multiplies x before the softmax (attention: 1/sqrt(head_dim))",
    )
    causal: bool = Field(
        default=False,
        strict=True,
        description="mask each query's later keys: column c of row r is left out (y = 0) when "
        "c > r mod queries + cols - queries (aligned to the last key, as a KV-cache decode "
        "needs)",
    )
    queries: Annotated[int, Field(strict=True, ge=1), PLAIN_INTEGER] | None = Field(
        default=None,
        description="rows of one attention matrix, the query length (causal only; default "
        "cols, a square mask)",
    )

    @model_validator(mode="before")
    @classmethod
    def _square_by_default(cls, data: Any) -> Any:
        # A causal mask's query length written out when left to its default (cols), so the two
        # spellings of one workload are one value: equal, of one document and hash (a sweep's
        # dataset, written out, was refused as "a dataset of" the operator it is).
        if (
            isinstance(data, dict)
            and data.get("causal") is True
            and data.get("queries") is None
            and isinstance(data.get("cols"), numbers.Integral)
            and not isinstance(data.get("cols"), bool)
        ):
            return {**data, "queries": data["cols"]}
        return data

    @model_validator(mode="after")
    def _scale_in_float32(self) -> Softmax:
        # The kernels and the reference multiply by scale in float32: past its largest finite
        # number it becomes inf (every row NaN), below its smallest normal one a subnormal or 0
        # (1e308 and 1e-300 were accepted, labelled as given, and computed as inf and 0).
        if not FLOAT32_TINY <= self.scale <= FLOAT32_MAX:
            raise WorkloadError(
                "scale",
                f"must be within float32's normal range, {FLOAT32_TINY:.9g} to "
                f"{FLOAT32_MAX:.9g} (the kernels compute in float32), got {self.scale:g}",
            )
        return self

    @model_validator(mode="after")
    def _check_mask(self) -> Softmax:
        if self.queries is None:
            return self
        if not self.causal:
            # Only the mask reads it: accepting it would make two documents of one operator.
            raise WorkloadError("queries", "is the causal mask's query length: set causal too")
        if self.queries > self.cols:
            raise WorkloadError(
                "queries",
                f"must be at most cols ({self.cols}), got {self.queries}: the mask is aligned to "
                "the last key, so a query before the first key would see none",
            )
        if self.rows % self.queries:
            raise WorkloadError(
                "queries",
                f"must divide rows ({self.rows}), got {self.queries}: rows are whole "
                "attention matrices of queries rows each",
            )
        return self

    @property
    def read_fraction(self) -> float:
        """Keys the mask leaves, over all: query i of L sees cols - L + 1 + i keys, so an
        attention matrix L·(2·cols - L + 1)/2 of its L·cols (about half when square)."""
        q = self.mask_queries
        if not q:
            return 1.0
        return (2 * self.cols - q + 1) / (2 * self.cols)

    @property
    def mask_queries(self) -> int:
        """The causal mask's query length (rows of one attention matrix), 0 without a mask:
        the kernels' ``queries`` argument."""
        if not self.causal:
            return 0
        return self.cols if self.queries is None else self.queries

    def canonical(self) -> dict[str, Any]:
        data = super().canonical()
        # A plain softmax's document (so its hash) is the one written before the fields
        # existed.
        if self.scale == 1.0:
            del data["scale"]
        if not self.causal:
            del data["causal"], data["queries"]
        return data

    @property
    def has_output_pass(self) -> bool:
        return True

    def label(self) -> str:
        text = f"softmax {self.rows}x{self.cols}"
        if self.scale != 1.0:
            text += f" scale={self.scale:g}"
        if self.causal:
            q = self.mask_queries
            text += " causal" if q == self.cols else f" causal q={q}"
        return text + self.dtype_suffix()


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


def softmax(
    rows: int, cols: int, scale: float = 1.0, causal: bool = False, queries: int | None = None
) -> Softmax:
    data = {"op": "softmax", "rows": rows, "cols": cols, "scale": scale, "causal": causal}
    return parse_mem_workload({**data, "queries": queries})  # type: ignore[return-value]


def layernorm(rows: int, cols: int, eps: float = 1e-5) -> LayerNorm:
    return parse_mem_workload({"op": "layernorm", "rows": rows, "cols": cols, "eps": eps})  # type: ignore[return-value]


def rmsnorm(rows: int, cols: int, eps: float = 1e-5) -> RMSNorm:
    return parse_mem_workload({"op": "rmsnorm", "rows": rows, "cols": cols, "eps": eps})  # type: ignore[return-value]


def bias_gelu(rows: int, cols: int, approximate: str = "none") -> BiasGelu:
    data = {"op": "bias_gelu", "rows": rows, "cols": cols, "approximate": approximate}
    return parse_mem_workload(data)  # type: ignore[return-value]


def silu_mul(rows: int, cols: int) -> SiluMul:
    return parse_mem_workload({"op": "silu_mul", "rows": rows, "cols": cols})  # type: ignore[return-value]
