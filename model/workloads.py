"""Operators (workloads) and their implicit-GEMM view.

Workloads are pydantic models so that one definition serves the library, the CLI and the
REST API (a bad field becomes a 422 naming the field). Every operator reduces to a
(batch, M, N, K) GEMM that the pipelined tensor-core kernel family computes.

Limits, and why:
- sizes are strict positive integers (a float or a string is a mistake, not a size);
- every operand has fewer than 2**31 elements, because the kernels index with 32-bit ints;
- leading dimensions are multiples of 8 elements: the loaders move 16 bytes per cp.async;
- a batched GEMM's batch is at most GRID_Z_LIMIT: its kernels launch one grid z slice per
  batch entry, and CUDA refuses a larger gridDim.z (accepting it would tune a kernel that
  can never be launched).
"""

from __future__ import annotations

import hashlib
import json
import reprlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from pipetune.model.errors import InvalidArgumentError
from pipetune.model.plain_numbers import PLAIN_INTEGER

INDEX_LIMIT = 2**31 - 1  # int32 element indexing in the generated kernels
DIM_LIMIT = 1 << 24  # no single dimension of a real operator comes near this
ALIGN_ELEMENTS = 8  # 16-byte cp.async of float16
# CUDA's limit on gridDim.y and gridDim.z (x allows 2^31-1). Defined here, with the workloads
# it bounds, so that the code generators (workers/codegen) check their launches against the
# same number the validation refuses a batch with.
GRID_Z_LIMIT = 65535

# Strict (a "64" or a 64.0 is a mistake), but a NumPy integer is the int it holds.
# (The Field first: after a validator, pydantic publishes its bounds as "ge"/"le", which
# JSON Schema does not have, and /openapi.json's readers saw no bounds at all.)
Dim = Annotated[int, Field(strict=True, ge=1, le=DIM_LIMIT), PLAIN_INTEGER]
SmallDim = Annotated[int, Field(strict=True, ge=1, le=64), PLAIN_INTEGER]
Pad = Annotated[int, Field(strict=True, ge=0, le=64), PLAIN_INTEGER]
# The tensor-core family's element types: 16-bit storage, fp32 accumulation (mma.sync takes
# both from sm_80). A workload names its type, and one of another type is another workload
# (its hash differs; float16's documents are unchanged: the field was always there).
DType = Literal["float16", "bfloat16"]
DTYPES: tuple[str, ...] = ("float16", "bfloat16")
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}  # in labels: "gemm 64x64x64 bf16"
# GELU's two forms, as PyTorch's ``approximate``: "none" (erf; BERT) and "tanh" (GPT-2's
# gelu_new). The stitched bias_gelu operator and the GEMM with bias + GELU in its epilogue
# take the same field.
GeluForm = Annotated[
    Literal["none", "tanh"], Field(description="GELU form: none (erf, BERT) or tanh (GPT-2)")
]


def dtype_suffix(dtype: str) -> str:
    """What a workload's label adds for its element type: nothing for float16 (every label
    written before bfloat16 existed stays as it was), " bf16" otherwise."""
    return "" if dtype == "float16" else f" {DTYPE_SHORT[dtype]}"


class WorkloadError(InvalidArgumentError):
    """A workload that pipetune cannot run, with the offending field (its `argument` too:
    `except pipetune.InvalidArgumentError` catches a bad workload as every bad argument)."""

    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.field = field


class GemmView(BaseModel):
    """The (batch, M, N, K) problem an operator lowers to."""

    model_config = ConfigDict(frozen=True)
    batch: int
    m: int
    n: int
    k: int


def _about(text: str) -> Any:
    """A field's description: the CLI's --help and the API schema show it."""
    return Field(description=text)


class _Workload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Annotated[
        DType, _about("element type of the operands: float16 or bfloat16 (fp32 accumulation)")
    ] = "float16"

    def gemm_view(self) -> GemmView:  # pragma: no cover - every operator overrides it
        raise NotImplementedError

    @property
    def flops(self) -> int:
        v = self.gemm_view()
        return 2 * v.batch * v.m * v.n * v.k

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        """Bytes of the A, B and C tensors as stored (not the im2col view)."""
        raise NotImplementedError  # pragma: no cover

    @property
    def compulsory_bytes(self) -> int:
        """DRAM traffic with perfect reuse: read A and B once, write C once."""
        return sum(self.operand_bytes)

    def canonical(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def workload_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def label(self) -> str:  # pragma: no cover - every operator overrides it
        raise NotImplementedError

    def dtype_suffix(self) -> str:
        return dtype_suffix(self.dtype)


def _check_index(operand: str, elements: int, **dims: int) -> None:
    """An operand of `elements` elements must be indexable with 32 bits. The error names
    the largest of the request's sizes it grows with (`dims`, field: size; the likeliest
    mistake) and says which operand overflows, so that a batched GEMM whose b is 1 is not
    told that b is wrong."""
    if elements > INDEX_LIMIT:
        field = max(dims, key=lambda name: dims[name])
        sizes = ", ".join(f"{name}={size}" for name, size in dims.items())
        raise WorkloadError(
            field,
            f"{operand} has {elements} elements ({sizes}), over the 2^31-1 limit of 32-bit "
            "kernel indexing",
        )


def _check_aligned(field: str, value: int, why: str) -> None:
    if value % ALIGN_ELEMENTS:
        raise WorkloadError(
            field,
            f"must be a multiple of {ALIGN_ELEMENTS} for 16-bit elements ({why} is a leading "
            f"dimension; loads are 16-byte cp.async), got {value}",
        )


def _check_gemm_operands(m: int, n: int, k: int) -> None:
    """An M x K by K x N product's operands: indexable with 32 bits, K and N 16-byte rows."""
    _check_index("A", m * k, m=m, k=k)
    _check_index("B", k * n, k=k, n=n)
    _check_index("C", m * n, m=m, n=n)
    _check_aligned("k", k, "K of A")
    _check_aligned("n", n, "N of C")


class Gemm(_Workload):
    """C[M,N] = A[M,K] @ B, row-major; B is K×N (b_layout 'kn') or N×K ('nk')."""

    op: Literal["gemm"] = "gemm"
    m: Annotated[Dim, _about("rows of A and C")]
    n: Annotated[Dim, _about("columns of B and C")]
    k: Annotated[Dim, _about("the reduced dimension: columns of A, rows of B")]
    b_layout: Annotated[
        Literal["kn", "nk"], _about("B stored K×N (kn) or N×K (nk, a transposed weight)")
    ] = "kn"

    @model_validator(mode="after")
    def _validate(self) -> Gemm:
        _check_gemm_operands(self.m, self.n, self.k)
        return self

    def gemm_view(self) -> GemmView:
        return GemmView(batch=1, m=self.m, n=self.n, k=self.k)

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        return 2 * self.m * self.k, 2 * self.k * self.n, 2 * self.m * self.n

    def label(self) -> str:
        # B's layout picks another kernel (gemm_nk): without it a GEMM tuned with both read
        # the same in every table, `pipetune tasks` and export's alike.
        layout = " nk" if self.b_layout == "nk" else ""
        return f"gemm {self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


# The fused GEMM + SwiGLU's weights interleave the gate's and the up projection's columns in
# groups of this many (one mma.sync n8 tile each): a thread's accumulators then hold a gate
# value and its up value side by side, and the epilogue gates them without a shuffle.
SWIGLU_INTERLEAVE = 8


class GemmSwiglu(_Workload):
    """C[M,N] = silu(A @ W_gate) · (A @ W_up): the gate and up projections as one GEMM whose
    epilogue applies the SwiGLU. B holds both weights, 2N columns (b_layout 'kn', K×2N; or
    'nk', 2N×K) interleaved in groups of 8: columns 16t..16t+7 are the gate's 8t..8t+7,
    16t+8..16t+15 the up projection's (pipetune.interleave_gate_up builds it)."""

    op: Literal["gemm_swiglu"] = "gemm_swiglu"
    m: Annotated[Dim, _about("rows of A and C")]
    n: Annotated[Dim, _about("columns of C: the width of each projection (B has 2n)")]
    k: Annotated[Dim, _about("the reduced dimension: columns of A, rows of B")]
    b_layout: Annotated[
        Literal["kn", "nk"],
        _about("B stored K×2N (kn) or 2N×K (nk, transposed weights), gate and up interleaved"),
    ] = "kn"

    @model_validator(mode="after")
    def _validate(self) -> GemmSwiglu:
        _check_index("A", self.m * self.k, m=self.m, k=self.k)
        _check_index("B", self.k * 2 * self.n, k=self.k, n=self.n)
        _check_index("C", self.m * self.n, m=self.m, n=self.n)
        _check_aligned("k", self.k, "K of A")
        _check_aligned("n", self.n, "N of C")
        return self

    def gemm_view(self) -> GemmView:
        # The GEMM the kernel computes: both projections, 2N interleaved columns.
        return GemmView(batch=1, m=self.m, n=2 * self.n, k=self.k)

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        return 2 * self.m * self.k, 2 * self.k * 2 * self.n, 2 * self.m * self.n

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return f"gemm_swiglu {self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


class GemmBiasGelu(_Workload):
    """C[M,N] = gelu(A @ B + bias): a linear layer's GEMM with its bias and GELU in the
    epilogue (BERT's and GPT-2's FC1), one kernel where the unfused pair is a GEMM and the
    stitched bias_gelu operator. bias has N elements; B is K×N (b_layout 'kn') or N×K ('nk',
    as torch.nn.Linear stores its weight)."""

    op: Literal["gemm_bias_gelu"] = "gemm_bias_gelu"
    m: Annotated[Dim, _about("rows of A and C")]
    n: Annotated[Dim, _about("columns of B and C, and the bias's length")]
    k: Annotated[Dim, _about("the reduced dimension: columns of A, rows of B")]
    b_layout: Annotated[
        Literal["kn", "nk"], _about("B stored K×N (kn) or N×K (nk, a transposed weight)")
    ] = "kn"
    approximate: GeluForm = "none"

    @model_validator(mode="after")
    def _validate(self) -> GemmBiasGelu:
        _check_gemm_operands(self.m, self.n, self.k)
        return self

    def gemm_view(self) -> GemmView:
        return GemmView(batch=1, m=self.m, n=self.n, k=self.k)

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        return 2 * self.m * self.k, 2 * self.k * self.n, 2 * self.m * self.n

    @property
    def compulsory_bytes(self) -> int:
        return sum(self.operand_bytes) + 2 * self.n  # and the bias, read once

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return (
            f"gemm_bias_gelu({self.approximate}) {self.m}x{self.n}x{self.k}{layout}"
            f"{self.dtype_suffix()}"
        )


class Bmm(_Workload):
    """Batched GEMM: b independent M×K @ B products (grid z); each B is K×N (b_layout 'kn')
    or N×K ('nk': attention's Q·Kᵀ over keys stored sequence-major, as frameworks hold them)."""

    op: Literal["bmm"] = "bmm"
    b: Annotated[Dim, _about("batch: independent products")]
    m: Annotated[Dim, _about("rows of each A and C")]
    n: Annotated[Dim, _about("columns of each B and C")]
    k: Annotated[Dim, _about("the reduced dimension: columns of A, rows of B")]
    b_layout: Annotated[
        Literal["kn", "nk"],
        _about("each B stored K×N (kn) or N×K (nk, e.g. attention's keys for Q·Kᵀ)"),
    ] = "kn"

    def canonical(self) -> dict[str, Any]:
        data = super().canonical()
        if self.b_layout == "kn":
            # The document (so the hash) of a kn BMM is the one written before BMMs had the
            # field: every recorded BMM, task and trial keeps its identity.
            del data["b_layout"]
        return data

    @model_validator(mode="after")
    def _validate(self) -> Bmm:
        b, m, n, k = self.b, self.m, self.n, self.k
        if b > GRID_Z_LIMIT:
            raise WorkloadError(
                "b",
                f"must be at most {GRID_Z_LIMIT}, got {b}: the batch is the kernel grid's z "
                f"dimension, which CUDA limits to {GRID_Z_LIMIT} blocks",
            )
        _check_index("A", b * m * k, b=b, m=m, k=k)
        _check_index("B", b * k * n, b=b, k=k, n=n)
        _check_index("C", b * m * n, b=b, m=m, n=n)
        _check_aligned("k", self.k, "K of A" if self.b_layout == "kn" else "K of A and B")
        _check_aligned("n", self.n, "N of B and C" if self.b_layout == "kn" else "N of C")
        return self

    def gemm_view(self) -> GemmView:
        return GemmView(batch=self.b, m=self.m, n=self.n, k=self.k)

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        b = self.b
        return 2 * b * self.m * self.k, 2 * b * self.k * self.n, 2 * b * self.m * self.n

    def label(self) -> str:
        layout = " nk" if self.b_layout == "nk" else ""
        return f"bmm {self.b}x{self.m}x{self.n}x{self.k}{layout}{self.dtype_suffix()}"


def _out_size(field: str, size_field: str, size: int, filt: int, stride: int, pad: int) -> int:
    padded = size + 2 * pad
    if filt > padded:
        # Either side may be the mistake: the message names the input's field as well.
        raise WorkloadError(
            field,
            f"filter {filt} is larger than the padded input ({size_field} {size} + 2 x pad "
            f"{pad} = {padded})",
        )
    return (padded - filt) // stride + 1


def _check_pad(field: str, pad: int, filt: int) -> None:
    if pad >= filt:
        raise WorkloadError(
            "pad", f"must be smaller than the filter size {field}={filt}, got {pad}"
        )


class Conv2d(_Workload):
    """Conv2D, NHWC input, KRSC filter, as an implicit GEMM: M=N·P·Q, N=K, K=R·S·C."""

    op: Literal["conv2d"] = "conv2d"
    n: Annotated[Dim, _about("batch of input images")]
    h: Annotated[Dim, _about("input height")]
    w: Annotated[Dim, _about("input width")]
    c: Annotated[Dim, _about("input channels")]
    k: Annotated[Dim, _about("output channels (filters)")]
    r: Annotated[SmallDim, _about("filter height")]
    s: Annotated[SmallDim, _about("filter width")]
    stride: Annotated[SmallDim, _about("stride, both spatial dimensions")] = 1
    pad: Annotated[Pad, _about("zero padding on each side, both spatial dimensions")] = 0

    @model_validator(mode="after")
    def _validate(self) -> Conv2d:
        _check_pad("r", self.pad, self.r)
        _check_pad("s", self.pad, self.s)
        _out_size("r", "h", self.h, self.r, self.stride, self.pad)
        _out_size("s", "w", self.w, self.s, self.stride, self.pad)
        _check_aligned("c", self.c, "C of the NHWC input")
        _check_aligned("k", self.k, "K of the NPQK output")
        n, h, w, c, k = self.n, self.h, self.w, self.c, self.k
        _check_index("the input", n * h * w * c, n=n, h=h, w=w, c=c)
        _check_index("the filter", k * self.r * self.s * c, k=k, c=c)
        v = self.gemm_view()
        _check_index("the output", v.m * v.n, n=n, h=h, w=w, k=k)
        return self

    @property
    def out_hw(self) -> tuple[int, int]:
        return (
            (self.h + 2 * self.pad - self.r) // self.stride + 1,
            (self.w + 2 * self.pad - self.s) // self.stride + 1,
        )

    def gemm_view(self) -> GemmView:
        p, q = self.out_hw
        return GemmView(batch=1, m=self.n * p * q, n=self.k, k=self.r * self.s * self.c)

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        p, q = self.out_hw
        return (
            2 * self.n * self.h * self.w * self.c,
            2 * self.k * self.r * self.s * self.c,
            2 * self.n * p * q * self.k,
        )

    def label(self) -> str:
        return (
            f"conv2d n{self.n} {self.h}x{self.w}x{self.c}->{self.k} "
            f"{self.r}x{self.s} s{self.stride} p{self.pad}{self.dtype_suffix()}"
        )


class Conv3d(_Workload):
    """Conv3D, NDHWC input, KTRSC filter: M=N·O·P·Q, N=K, K=T·R·S·C."""

    op: Literal["conv3d"] = "conv3d"
    n: Annotated[Dim, _about("batch of input volumes")]
    d: Annotated[Dim, _about("input depth")]
    h: Annotated[Dim, _about("input height")]
    w: Annotated[Dim, _about("input width")]
    c: Annotated[Dim, _about("input channels")]
    k: Annotated[Dim, _about("output channels (filters)")]
    t: Annotated[SmallDim, _about("filter depth")]
    r: Annotated[SmallDim, _about("filter height")]
    s: Annotated[SmallDim, _about("filter width")]
    stride: Annotated[SmallDim, _about("stride, all three spatial dimensions")] = 1
    pad: Annotated[Pad, _about("zero padding on each side, all three spatial dimensions")] = 0

    @model_validator(mode="after")
    def _validate(self) -> Conv3d:
        for name, filt in (("t", self.t), ("r", self.r), ("s", self.s)):
            _check_pad(name, self.pad, filt)
        _out_size("t", "d", self.d, self.t, self.stride, self.pad)
        _out_size("r", "h", self.h, self.r, self.stride, self.pad)
        _out_size("s", "w", self.w, self.s, self.stride, self.pad)
        _check_aligned("c", self.c, "C of the NDHWC input")
        _check_aligned("k", self.k, "K of the output")
        n, d, h, w, c, k = self.n, self.d, self.h, self.w, self.c, self.k
        _check_index("the input", n * d * h * w * c, n=n, d=d, h=h, w=w, c=c)
        _check_index("the filter", k * self.t * self.r * self.s * c, k=k, c=c)
        v = self.gemm_view()
        _check_index("the output", v.m * v.n, n=n, d=d, h=h, w=w, k=k)
        return self

    @property
    def out_dhw(self) -> tuple[int, int, int]:
        def out(size: int, filt: int) -> int:
            return (size + 2 * self.pad - filt) // self.stride + 1

        return out(self.d, self.t), out(self.h, self.r), out(self.w, self.s)

    def gemm_view(self) -> GemmView:
        o, p, q = self.out_dhw
        return GemmView(
            batch=1, m=self.n * o * p * q, n=self.k, k=self.t * self.r * self.s * self.c
        )

    @property
    def operand_bytes(self) -> tuple[int, int, int]:
        o, p, q = self.out_dhw
        return (
            2 * self.n * self.d * self.h * self.w * self.c,
            2 * self.k * self.t * self.r * self.s * self.c,
            2 * self.n * o * p * q * self.k,
        )

    def label(self) -> str:
        return (
            f"conv3d n{self.n} {self.d}x{self.h}x{self.w}x{self.c}->{self.k} "
            f"{self.t}x{self.r}x{self.s} s{self.stride} p{self.pad}{self.dtype_suffix()}"
        )


Workload = Annotated[
    Gemm | GemmSwiglu | GemmBiasGelu | Bmm | Conv2d | Conv3d, Field(discriminator="op")
]
# Operator name -> type, read from each type's `op` tag: the names are declared once, there.
OPS: dict[str, type[_Workload]] = {
    str(cls.model_fields["op"].default): cls
    for cls in (Gemm, GemmSwiglu, GemmBiasGelu, Bmm, Conv2d, Conv3d)
}
_WORKLOAD_ADAPTER: TypeAdapter[Gemm | GemmSwiglu | GemmBiasGelu | Bmm | Conv2d | Conv3d] = (
    TypeAdapter(Workload)
)


def first_error(
    exc: ValidationError, ops: Mapping[str, Any], show: Callable[[Any], str] = repr
) -> WorkloadError:
    """A pydantic error of a workload of one of `ops` as WorkloadError: the field (without the
    discriminated union's op tag) and the reason, with the input as `show` writes it."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    if loc and loc[0] in ops:  # the discriminated union puts the op tag first
        loc = loc[1:]
    field = ".".join(loc) or "workload"
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, WorkloadError):
        return ctx_error
    reason = err.get("msg", "invalid")
    if "input" in err and err.get("type") != "missing":
        reason = f"{reason} (got {show(err['input'])})"
    return WorkloadError(field, reason)


def parse_tagged(
    data: Any,
    ops: Mapping[str, Any],
    adapter: TypeAdapter[Any],
    kernels: str,
    show: Callable[[Any], str] = reprlib.repr,
    dtypes: tuple[str, ...] = ("float16",),
) -> Any:
    """A workload of one of a family's `ops` (a discriminated union on "op", `adapter`) from
    a plain dict, raising WorkloadError with the field and reason; `kernels` names who takes
    only the element types `dtypes`, `show` how a bad input is written back."""
    if not isinstance(data, dict):
        raise WorkloadError("workload", "must be an object with an 'op' field")
    op = data.get("op")
    # isinstance first: a list or dict is unhashable, and `in` on the mapping would raise.
    if not isinstance(op, str) or op not in ops:
        shown = reprlib.repr(op)  # bounded: the input may be any size
        raise WorkloadError("op", f"unknown operator {shown}; known: {', '.join(ops)}")
    dtype = data.get("dtype", "float16")
    if not isinstance(dtype, str) or dtype not in dtypes:
        raise WorkloadError(
            "dtype",
            f"unsupported dtype {reprlib.repr(dtype)}: {kernels} take {' or '.join(dtypes)} inputs",
        )
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise first_error(exc, ops, show) from None


def parse_workload(data: dict[str, Any]) -> AnyWorkload:
    """Build a workload from a plain dict, raising WorkloadError with the field and reason."""
    return parse_tagged(  # type: ignore[no-any-return]
        data, OPS, _WORKLOAD_ADAPTER, "pipetune's tensor-core kernels", show=repr, dtypes=DTYPES
    )


def gemm(m: int, n: int, k: int, **kw: Any) -> Gemm:
    return parse_workload({"op": "gemm", "m": m, "n": n, "k": k, **kw})  # type: ignore[return-value]


def gemm_swiglu(m: int, n: int, k: int, **kw: Any) -> GemmSwiglu:
    return parse_workload({"op": "gemm_swiglu", "m": m, "n": n, "k": k, **kw})  # type: ignore[return-value]


def gemm_bias_gelu(m: int, n: int, k: int, **kw: Any) -> GemmBiasGelu:
    return parse_workload({"op": "gemm_bias_gelu", "m": m, "n": n, "k": k, **kw})  # type: ignore[return-value]


def bmm(b: int, m: int, n: int, k: int, **kw: Any) -> Bmm:
    return parse_workload({"op": "bmm", "b": b, "m": m, "n": n, "k": k, **kw})  # type: ignore[return-value]


def conv2d(
    n: int, h: int, w: int, c: int, k: int, r: int, s: int, stride: int = 1, pad: int = 0
) -> Conv2d:
    data = {"op": "conv2d", "n": n, "h": h, "w": w, "c": c, "k": k, "r": r, "s": s}
    return parse_workload({**data, "stride": stride, "pad": pad})  # type: ignore[return-value]


def conv3d(
    n: int,
    d: int,
    h: int,
    w: int,
    c: int,
    k: int,
    t: int,
    r: int,
    s: int,
    stride: int = 1,
    pad: int = 0,
) -> Conv3d:
    data = {"op": "conv3d", "n": n, "d": d, "h": h, "w": w, "c": c, "k": k}
    return parse_workload({**data, "t": t, "r": r, "s": s, "stride": stride, "pad": pad})  # type: ignore[return-value]


AnyWorkload = Gemm | GemmSwiglu | GemmBiasGelu | Bmm | Conv2d | Conv3d
