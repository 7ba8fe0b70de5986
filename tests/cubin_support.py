"""Reading a cubin's target architecture from its ELF header (no cuobjdump needed).

A cubin is an ELF64 file with e_machine EM_CUDA (190). The SM version is in e_flags: bits
8..15 from ELF ABI version 8 on (CUDA 12.8+, sm_90 -> 0x5a00), bits 0..7 before.
"""

from __future__ import annotations

import struct

EM_CUDA = 190


def cubin_sm(cubin: bytes) -> int:
    """The SM number a cubin targets (90 for sm_90 and sm_90a)."""
    assert cubin[:4] == b"\x7fELF", "not an ELF file"
    assert cubin[4] == 2, "not ELF64"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    assert machine == EM_CUDA, f"e_machine {machine} is not EM_CUDA"
    (flags,) = struct.unpack_from("<I", cubin, 48)
    abi_version = cubin[8]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
