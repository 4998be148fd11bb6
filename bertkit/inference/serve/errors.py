"""What the server answers instead of a result: a client error with its status, or nothing
for a client that left; and the exception handlers, which make every error a JSON object with
"error" (what is wrong)."""
from __future__ import annotations

import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ...errors import BertkitError
from .config import MAX_ERRORS_SHOWN


class RequestError(Exception):
    """A client error: its HTTP status and a message that names the field or the limit."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""


class ErrorResponse(JSONResponse):
    """An error that may echo what the client sent: NaN and Infinity (which Python's JSON
    parser accepts) become strings and lone surrogates "?", where JSONResponse would fail (a 500)."""

    def render(self, content) -> bytes:
        try:
            content = json.loads(json.dumps(content, default=str), parse_constant=str)
        except RecursionError:  # an echo nested nearly as deep as the parser allows: the message alone
            content = {"error": str(content.get("error"))}
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


async def request_error(request: Request, e: RequestError) -> Response:
    return ErrorResponse({"error": str(e)}, status_code=e.status, headers=e.headers)


async def client_gone(request: Request, e: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it, the metrics count it


async def bertkit_error(request: Request, e: BertkitError) -> Response:
    return ErrorResponse({"error": str(e)}, status_code=422)


async def validation_error(request: Request, e: RequestValidationError) -> Response:
    errors = e.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":  # loc holds the character where parsing stopped
        where, msg = "body", f"invalid JSON at character {first['loc'][-1]} ({first.get('ctx', {}).get('error')})"
    elif first.get("type") == "model_attributes_type" and "json" not in request.headers.get("content-type", ""):
        msg += " (send the body as JSON, with Content-Type: application/json)"
    # the first errors, without the input each echoes: a body can hold thousands of bad items
    detail = [{k: err[k] for k in ("type", "loc", "msg") if k in err} for err in errors[:MAX_ERRORS_SHOWN]]
    more = {"more_errors": len(errors) - MAX_ERRORS_SHOWN} if len(errors) > MAX_ERRORS_SHOWN else {}
    return ErrorResponse({"error": f"{where}: {msg}", "detail": detail, **more}, status_code=422)


async def http_error(request: Request, e: HTTPException) -> Response:
    """Starlette's and FastAPI's own errors: 404, 405, a body that does not parse."""
    cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
    if e.status_code == 400 and e.__cause__ is not None:  # a body FastAPI could not parse: as bad JSON is
        why = ("not UTF-8 text" if isinstance(e.__cause__, UnicodeDecodeError) else
               "nested too deeply" if isinstance(e.__cause__, RecursionError) else str(e.__cause__)[:200])
        return ErrorResponse({"error": f"body: not valid JSON ({why})"}, status_code=422)
    return ErrorResponse({"error": f"{request.method} {request.url.path}: {e.detail}{cause}", "detail": e.detail},
                         status_code=e.status_code, headers=e.headers)


async def internal_error(request: Request, e: Exception) -> Response:
    return ErrorResponse({"error": f"internal error: {type(e).__name__}: {e}"}, status_code=500)


# for FastAPI(exception_handlers=...): an error gets the handler of its nearest class
HANDLERS = {RequestError: request_error, ClientGone: client_gone, BertkitError: bertkit_error,
            RequestValidationError: validation_error, HTTPException: http_error, Exception: internal_error}
