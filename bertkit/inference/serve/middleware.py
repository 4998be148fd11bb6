"""The middleware around every request: the body size limit and the metrics' measure. Plain ASGI:
through Starlette's BaseHTTPMiddleware an endpoint does not see its client leave."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

BODY_READ_TIMEOUT_S = 30  # the longest wait for the next part of a request body
DRAIN_BYTES = 64 << 20  # an over-limit body is read to its end up to this size before the 413


class Measure:
    """Every answer counted by endpoint and status, with its latency."""

    def __init__(self, app, record: Callable[[str, int, float], None]):
        self.app, self.record = app, record

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:  # an exception is answered 500 by the handler outside this middleware: counted here
            self.record(scope["path"], status[0], time.perf_counter() - start)


class BodyLimit:
    """Refuses a request body over max_bytes with 413, by its Content-Length or, for a chunked
    body, as soon as the bytes read pass the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            # the body is read (up to a bound) before the 413: a server that answers and closes while
            # the client still sends can reach it as a reset, the answer never read
            drained = declared.isdigit() and int(declared) <= DRAIN_BYTES and await self._drain(receive)
            return await self._refuse(send, declared.decode("latin-1"), close=not drained)
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b""):  # a gzip body would be read as bytes that are not JSON
            return await self._answer(send, 415, f"Content-Encoding {encoding.decode('latin-1')!r} is not accepted: "
                                                 "send the body uncompressed")
        seen, exceeded, started = 0, False, False

        async def limited_receive():
            nonlocal seen, exceeded
            try:  # a client that stops sending (slowloris) does not hold its request open
                message = await asyncio.wait_for(receive(), BODY_READ_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise SlowBody() from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise TooLarge()
            return message

        async def guarded_send(message):
            # FastAPI turns an error while reading the body into its own 400: once the limit is
            # passed, whatever the app answers is replaced by the 413
            nonlocal started
            if exceeded:
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refuse(send, f"more than {self.max_bytes}")
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except TooLarge:
            if not started:
                await self._refuse(send, f"more than {self.max_bytes}")
        except SlowBody:
            if not started:
                await self._answer(send, 408, f"the request body did not arrive: nothing for {BODY_READ_TIMEOUT_S} s",
                                   close=True)

    @staticmethod
    async def _drain(receive) -> bool:
        """Read the request's body to its end (at most DRAIN_BYTES); whether it was read whole."""
        seen = 0
        while seen <= DRAIN_BYTES:
            try:
                message = await asyncio.wait_for(receive(), BODY_READ_TIMEOUT_S)
            except asyncio.TimeoutError:
                return False
            if message["type"] != "http.request":  # the client left
                return False
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False

    async def _refuse(self, send, size: str, close: bool = False):
        await self._answer(send, 413, f"request body of {size} bytes is over the limit of {self.max_bytes} bytes "
                                      "(--max-body-bytes)", close)

    @staticmethod
    async def _answer(send, status: int, error: str, close: bool = False):
        body = json.dumps({"error": error}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + ([(b"connection", b"close")] if close else [])})
        await send({"type": "http.response.body", "body": body})


class TooLarge(Exception):
    pass


class SlowBody(Exception):
    pass
