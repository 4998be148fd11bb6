"""One HTTP connection: uvicorn's h11 protocol with a deadline for each request's line and
headers, and its own refusals in the server's {"error": ...} form.

uvicorn closes an idle keep-alive connection but waits for a request's headers without end: a
client that opens connections and sends their headers a byte at a time (slowloris) holds them
all. Here each request's headers must arrive whole within HEADER_TIMEOUT_S of the connection
opening or of the previous answer; the body's own deadline is the middleware's."""
from __future__ import annotations

import json
import sys
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10  # the longest a request's line and headers may take to arrive
LINGER_S = 2  # how long a refused connection reads, and drops, what its client still sends
MAX_HEADER_BYTES = 16 << 10  # h11's default bound on them, named (uvicorn_config passes it on)


def refusal(status: int, error: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, its body the server's error object."""
    body = json.dumps({"error": error}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("latin-1") + body


class Connection(H11Protocol):
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.headers_due = None
        self.refused = False
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self.refused:  # read and dropped: see _refuse
            return
        # between requests the keep-alive timer bounds the wait for a first byte; from there the
        # request's headers have their own deadline
        if self.conn.their_state is h11.IDLE:
            self._await_headers()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request's headers are in (or it was refused)
            self._headers_in()

    def connection_lost(self, exc) -> None:
        self._headers_in()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # called while h11's RemoteProtocolError is being handled: its reason says what was wrong
        err = sys.exc_info()[1]
        status = getattr(err, "error_status_hint", 400)
        status = status if 400 <= status < 500 else 400
        if status == 431:  # h11 says "Receive buffer too long"
            self._refuse(431, f"invalid HTTP request: its line and headers are over "
                              f"{MAX_HEADER_BYTES:,} bytes")
        else:
            self._refuse(status, "invalid HTTP request" + (f": {err}" if err is not None and str(err) else ""))

    def _await_headers(self) -> None:
        if self.headers_due is None:
            self.headers_due = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _headers_in(self) -> None:
        if self.headers_due is not None:
            self.headers_due.cancel()
            self.headers_due = None

    def _headers_late(self) -> None:
        self.headers_due = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse(408, f"the request's line and headers did not arrive within {HEADER_TIMEOUT_S} s")

    def _refuse(self, status: int, error: str) -> None:
        """Answer and close, lingering: closed with the client's bytes unread (a 300 kB header,
        refused at 16 kB), the socket sent a reset that took the answer with it. The answer goes
        out with a FIN, and what the client still sends is read and dropped until it closes or
        LINGER_S pass."""
        self._unset_keepalive_if_required()
        self._headers_in()
        if self.refused or self.transport.is_closing():
            return
        self.refused = True
        self.transport.write(refusal(status, error))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
