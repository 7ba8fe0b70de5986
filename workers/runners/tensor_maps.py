"""TMA tensor maps: the 128-byte descriptors that the Hopper kernels' TMA loads read, encoded
on the host by the driver's cuTensorMapEncodeTiled from an operand's device address (a
LaunchPlan's :class:`~pipetune.workers.launch_plan.TensorMap`).

The driver is called through ctypes: CuPy does not wrap the function, and its C signature
is all it takes (so the runners' child and the user's call encode alike). The caller
uploads the bytes to device memory (64-byte aligned, as every CUDA allocation is) and
passes that pointer to the kernel.
"""

from __future__ import annotations

import ctypes
from typing import Any

TENSOR_MAP_BYTES = 128

# The driver's enumerators (cuda.h). The data types are enum CUtensorMapDataType's (cuda.h
# of CUDA 12.0 on, e.g. /usr/local/cuda-13.0/include/cuda.h: UINT8 = 0, UINT16, UINT32, INT32,
# UINT64, INT64, FLOAT16 = 6, FLOAT32, FLOAT64, BFLOAT16 = 9, ...; cuda-bindings'
# cuda.bindings.driver.CUtensorMapDataType says the same).
CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
# A map's data type by its operand's element type (workers/launch_plan.py TensorMap.dtype).
CU_TENSOR_MAP_DATA_TYPES: dict[str, int] = {
    "float16": CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    "bfloat16": CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
}
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # zeros past the edges


def encode_tensor_map(spec: Any, address: int) -> bytes:
    """The driver's 128-byte tensor map (cuTensorMapEncodeTiled) of ``spec`` (anything with
    ``dims``, ``strides``, ``box`` and ``dtype``: sizes and box innermost first, byte strides
    of the outer dimensions, the element type) over the operand at device ``address``.
    RuntimeError where the driver is missing or refuses."""
    data_type = CU_TENSOR_MAP_DATA_TYPES[spec.dtype]
    try:
        encode = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    except (OSError, AttributeError) as exc:  # no driver, or one older than CUDA 12
        raise RuntimeError(f"no cuTensorMapEncodeTiled in the CUDA driver: {exc}") from None
    encode.restype = ctypes.c_int
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    encode.argtypes = [
        ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64),
        ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u32),
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    rank = len(spec.dims)
    raw = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + 64))()  # the map must sit on a 64-byte boundary
    offset = -ctypes.addressof(raw) % 64
    status = encode(
        ctypes.addressof(raw) + offset,
        data_type,
        rank,
        address,
        (u64 * rank)(*spec.dims),
        (u64 * (rank - 1))(*spec.strides),
        (u32 * rank)(*spec.box),
        (u32 * rank)(*[1] * rank),
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for {spec}")
    return bytes(raw[offset : offset + TENSOR_MAP_BYTES])
