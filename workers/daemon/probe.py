"""`python -m pipetune.workers.daemon.probe [DEVICE]`: describe a CUDA device through CuPy as JSON.

Run in a child process by workers.daemon.gpu so that the worker process never holds a CUDA
context of its own. Exits 1 with the reason on stderr when there is no usable device.
"""

from __future__ import annotations

import json
import sys

CLOCK_RATE_ATTR = 13  # cudaDevAttrClockRate (kHz); cudaDeviceProp.clockRate is gone in CUDA 13


def describe(device: int) -> dict:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if device >= count:
        raise RuntimeError(f"CUDA device {device} requested, {count} present")
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        clock_mhz: int | None = round(
            cupy.cuda.runtime.deviceGetAttribute(CLOCK_RATE_ATTR, device) / 1000
        )
    except Exception:
        clock_mhz = None
    version = int(cupy.cuda.runtime.driverGetVersion())
    return {
        "device": device,
        "name": name,
        "arch": f"sm_{props['major']}{props['minor']}",
        "sm_count": int(props["multiProcessorCount"]),
        "clock_mhz": clock_mhz,
        "cuda_driver": f"CUDA {version // 1000}.{version % 1000 // 10}",
    }


def main() -> int:
    device = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    try:
        info = describe(device)
    except Exception as exc:
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
