"""What CuPy says about a CUDA device, as one JSON-ready dict (no import of CuPy here: the
caller passes the module, inside the process that owns the device).

CUDA 13 dropped the clock fields from cudaDeviceProp; clocks come from device attributes,
and any field the runtime does not answer is None rather than an error.
"""

from __future__ import annotations

from typing import Any

ATTR_CLOCK_RATE = 13  # cudaDevAttrClockRate, kHz
ATTR_MEMORY_CLOCK_RATE = 36  # cudaDevAttrMemoryClockRate, kHz
ATTR_MEMORY_BUS_WIDTH = 37  # cudaDevAttrGlobalMemoryBusWidth, bits


def _version(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}"


def describe_device(cupy: Any, device: int) -> dict[str, Any]:
    runtime = cupy.cuda.runtime
    count = runtime.getDeviceCount()
    if device >= count:
        raise RuntimeError(f"CUDA device {device} requested, {count} present")
    props = runtime.getDeviceProperties(device)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)

    def attribute(attr: int, scale: float = 1.0) -> int | None:
        try:
            return round(runtime.deviceGetAttribute(attr, device) / scale)
        except Exception:
            return None

    driver = int(runtime.driverGetVersion())
    runtime_version = int(runtime.runtimeGetVersion())
    return {
        "device": device,
        "name": name,
        "arch": f"sm_{props['major']}{props['minor']}",
        "sm_count": int(props["multiProcessorCount"]),
        "clock_mhz": attribute(ATTR_CLOCK_RATE, 1000),
        "memory_clock_mhz": attribute(ATTR_MEMORY_CLOCK_RATE, 1000),
        "memory_bus_bits": attribute(ATTR_MEMORY_BUS_WIDTH),
        "memory_bytes": int(props["totalGlobalMem"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "smem_per_block_optin": int(props.get("sharedMemPerBlockOptin", 0)) or None,
        "smem_per_sm": int(props.get("sharedMemPerMultiprocessor", 0)) or None,
        "cuda_driver": f"CUDA {_version(driver)}",
        "cuda_driver_version": driver,
        "cuda_runtime": f"CUDA {_version(runtime_version)}",
        "cuda_runtime_version": runtime_version,
    }
