"""uvicorn's httptools protocol with the two limits it lacks: the size of a request's head
(request line and headers) and the time a request may take to arrive.

httptools (uvicorn[standard], chosen for its CPU per request: issue 17) sets no limit on a
header, and joins a header's pieces as they come: one 160 MiB header froze the event loop
for 20 s and left the process 300 MB larger (h11 refuses a head past 16 KiB). And no timer
covers a request that arrives slowly: a connection that sends nothing, half a head or a
body one byte at a time stayed open for ever, so a few thousand of them used up the
process's file descriptors and every other client was refused. Here a head past
`MAX_HEAD_BYTES` is answered 431 and the connection closed before the parser sees it, and a
request not read whole within `read_timeout_s` of its first byte (or of the connection's
opening) has its connection closed. Once a request has arrived, its handler takes as long
as it takes (a lease long-poll waits up to its wait_s).

Written here rather than taken from elsewhere: uvicorn has neither option for httptools,
and a reverse proxy in front (which an exposed service should have anyway) is not something
`pipetune serve` can assume.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# A head larger than this is refused: pipetune's clients send well under 2 KiB (h11's own
# limit, uvicorn's other protocol, is 16 KiB).
MAX_HEAD_BYTES = 64 * 1024
READ_TIMEOUT_S = 60.0  # the default of Settings.request_read_timeout_s
LINGER_S = 2.0  # how long a refused connection's further bytes are read and dropped

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
)


def _answer(status_line: bytes, detail: str) -> bytes:
    body = b'{"detail":"' + detail.encode("ascii") + b'"}'
    return status_line + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a head size limit and a request read timeout (see above)."""

    read_timeout_s = READ_TIMEOUT_S  # set per server by `protocol_with`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes of the head read so far
        self._reading_head = True  # no request head complete since the last request
        self._request_open = True  # a request (or the first one) is still arriving
        self._read_timer: asyncio.TimerHandle | None = None
        self._refused = False  # answered 431: what comes after is dropped

    # ---- the timer -----------------------------------------------------------------------

    def _arm(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._request_open and not self.transport.is_closing():
            self.transport.close()

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a refused head, read and dropped until the close
        if self._reading_head:
            self._head_bytes += self._head_part(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse()
                return
        if not self._request_open:  # the first bytes of the next request on this connection
            self._request_open = True
        self._arm()
        super().data_received(data)

    def _head_part(self, data: bytes) -> int:
        """How many bytes of `data` belong to the head being read: up to the blank line that
        ends it. A body's first bytes often come in the same read as the head; counted as
        head, they got ordinary bodies of 70 KB a 431."""
        seen = self._head_tail + data
        # (A blank line of bare LFs too, for a parser lenient about line ends.)
        ends = [at + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (at := seen.find(mark)) >= 0]
        if not ends:
            self._head_tail = seen[-3:]  # a blank line may span two reads
            return len(data)
        self._head_tail = b""
        return max(0, min(ends) - (len(seen) - len(data)))

    def _refuse(self) -> None:
        """431, then a lingering close: the answer and an end of stream now, and what the
        client still sends read and dropped for LINGER_S. Closed at once, a socket with
        unread bytes sends a reset, and the client lost the answer (seen in CI)."""
        self._refused = True
        self._disarm()
        self.transport.write(_answer(_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes"))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    # ---- parser callbacks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._reading_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # The request has arrived: its handler's time is not limited here. The next head
        # (pipelined, or after keep-alive) is counted from zero.
        self._request_open = False
        self._reading_head = True
        self._head_bytes = 0
        self._head_tail = b""
        self._disarm()
        super().on_message_complete()


def protocol_with(read_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one server, with its read timeout."""
    return type(
        "GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"read_timeout_s": read_timeout_s}
    )
