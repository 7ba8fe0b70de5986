"""Which host names are this machine: `serve` on a loopback --host needs no API key, and a
worker whose --server is on this machine may use the token `serve` generated here."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or address, an IPv6 one bracketed or bare) is localhost or a
    loopback address: only this machine can reach it."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
