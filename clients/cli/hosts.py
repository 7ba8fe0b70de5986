"""Which host names are this machine: `serve` on a loopback --host needs no API key, and a
worker whose --server is on this machine may use the token `serve` generated here."""

from __future__ import annotations

import ipaddress
import socket

from pipetune.clients.sdk.http import is_loopback_name


def _resolved_loopback(name: str) -> bool:
    """Whether every address the name resolves to (as the listener's bind resolves it) is a
    loopback one: 127.1, or a name /etc/hosts gives as 127.0.0.1, is this machine too."""
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):  # an unknown name (serve then fails to bind it)
        return False
    addresses = {info[4][0] for info in found}
    return bool(addresses) and all(
        ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses
    )


def is_loopback_host(host: str, *, resolve: bool = False) -> bool:
    """Whether `host` (a name or address, an IPv6 one bracketed or bare) is localhost or a
    loopback address: only this machine can reach it. `resolve`: also a name or shorthand
    that resolves to loopback addresses only, for `serve --host`, which binds what it
    resolves to (by its text alone, `--host 127.1` or a name for 127.0.0.1 was taken for an
    address others reach: its open routes went without the guard against DNS rebinding).
    Not for a client deciding where to send a secret: it connects to what the name resolves
    to when it connects, which may no longer be this machine."""
    if is_loopback_name(host):
        return True
    bare = host.strip("[]")
    return resolve and bool(bare) and _resolved_loopback(bare)
