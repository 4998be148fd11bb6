"""What the server answers instead of a result: a client error with its status, or nothing
for a client that left."""
from __future__ import annotations


class RequestError(Exception):
    """A client error: its HTTP status and a message that names the field or the limit."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""
