"""`python -m pipetune.workers.daemon.probe [DEVICE]`: describe a CUDA device through CuPy as JSON.

Run in a child process by workers.daemon.gpu so that the worker process never holds a CUDA
context of its own. Exits 1 with the reason on stderr when there is no usable device.
"""

from __future__ import annotations

import json
import sys


def describe(device: int) -> dict:
    """The device as CuPy sees it (workers.runners.device_info: name, arch, SMs, clocks,
    memory, L2, driver and runtime versions)."""
    import cupy

    from pipetune.workers.runners.device_info import describe_device

    return describe_device(cupy, device)


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
