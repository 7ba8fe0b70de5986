"""The operands' element types on the host and the device, where numpy and CuPy have none
for bfloat16: a bfloat16 array is held as uint16 of its bits (the top half of a float32's).

Only the reference modules and the runners read arrays through here; a uint16 array reaching
``widen`` is taken to hold bfloat16 bits, which is how ``narrow`` and ``storage`` make them
(no input or output of pipetune's kernels is an integer array of 16 bits).
"""

from __future__ import annotations

from typing import Any

# Unit roundoff of each 16-bit type (half its epsilon): float16 keeps 11 significant bits,
# bfloat16 8 (the tolerances' rounding term).
UNIT_ROUNDOFF: dict[str, float] = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
# The array dtype that holds each buffer dtype (workers/launch_plan.py Buffer.dtype).
STORAGE: dict[str, str] = {
    "float16": "float16",
    "bfloat16": "uint16",
    "float32": "float32",
    "uint32": "uint32",
}


def storage(xp: Any, dtype: str) -> Any:
    """The numpy or CuPy dtype that holds a buffer of ``dtype``."""
    return getattr(xp, STORAGE[dtype])


def widen(xp: Any, array: Any) -> Any:
    """An array's values as float32 (exact for both 16-bit types): bfloat16 bits (uint16)
    shifted into a float32's top half, anything else converted."""
    if array.dtype == xp.uint16:
        return (array.astype(xp.uint32) << 16).view(xp.float32)
    return array.astype(xp.float32)


def narrow(xp: Any, values: Any, dtype: str) -> Any:
    """float32 values rounded to ``dtype`` (to nearest, ties to even, as cvt.rn does), held as
    ``storage`` holds it. NaN stays NaN (a quiet bfloat16 NaN); infinities stay infinite."""
    values = xp.asarray(values, dtype=xp.float32)
    if dtype == "float16":
        return values.astype(xp.float16)
    if dtype != "bfloat16":
        raise ValueError(f"no 16-bit rounding for {dtype!r}")
    bits = values.view(xp.uint32)
    # Round to nearest even on the low 16 bits: add 0x7FFF plus the kept part's lowest bit;
    # a carry into the exponent rounds up to the next binade (or to infinity) as it should.
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = xp.isnan(values)
    return xp.where(nan, xp.uint32(0x7FC0), rounded).astype(xp.uint16)
