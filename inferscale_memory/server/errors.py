"""Errors in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``.

Every failure of the server, from a malformed body to a library error, leaves as one of
these with a proper status code; :func:`install_handlers` registers the mapping on the app.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferscale_memory.errors import (
    ContextLengthError,
    EngineError,
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    RequestFailedError,
    SchemaError,
    StoreError,
    UnknownUserError,
)
from inferscale_memory.server.schemas import ErrorResponse

logger = logging.getLogger(__name__)

# Library errors, most specific first: (type, status, OpenAI error type, code).
LIBRARY_ERRORS: list[tuple[type[Exception], int, str, str | None]] = [
    (ContextLengthError, 400, "invalid_request_error", "context_length_exceeded"),
    (InvalidInputError, 400, "invalid_request_error", "invalid_value"),
    (UnknownUserError, 404, "not_found_error", "user_not_found"),
    (FactNotFoundError, 404, "not_found_error", "memory_not_found"),
    (StoreError, 503, "server_error", "store_unavailable"),
    # vLLM failed this one request and goes on serving: the server's fault, not the
    # client's, and no outage (docs/reliability.md, "Status by cause").
    (RequestFailedError, 500, "server_error", "engine_request_failed"),
    # Closed, or its engine core died (EngineDiedError): the engine serves nothing more.
    (EngineError, 503, "server_error", "engine_unavailable"),
    (InferScaleError, 500, "server_error", None),
]
# OpenAPI documentation of the error responses every /v1 endpoint may give.
ErrorResponseDoc: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in (
        (400, "Invalid request"), (401, "Missing or invalid API key"),
        (403, "The key may not act for this user"), (404, "Not found"),
        (413, "Body too large"))}
HTTP_TYPES = {400: "invalid_request_error", 401: "authentication_error",
              403: "permission_error", 404: "not_found_error", 413: "invalid_request_error"}


class APIError(Exception):
    """An error the server answers with directly.

    Args:
        status: HTTP status code.
        message: What went wrong and what to do.
        type: OpenAI error type (``invalid_request_error``, ``authentication_error``, ...).
        param: The request parameter at fault, if any.
        code: A machine-readable code (``model_not_found``, ``invalid_api_key``, ...).
    """

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or HTTP_TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body of the error."""
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        """The error as a response."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class ClientDisconnected(APIError):
    """The client went away before its answer was ready: counted as nginx's 499 (not a
    server error); nobody reads the body."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the connection before the answer",
                         code="client_closed_request")


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_exception(exc: BaseException) -> APIError:
    """Map any exception to an :class:`APIError` (unknown ones become a bare 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SchemaError):
        return schema_error(exc)
    for kind, status, type_, code in LIBRARY_ERRORS:
        if isinstance(exc, kind):
            return APIError(status, str(exc) or kind.__name__, type=type_, code=code,
                            param=getattr(exc, "param", None))
    return APIError(500, "internal server error", type="server_error", code="internal_error")


def log_failure(what: str, exc: BaseException) -> None:
    """Log ``what`` failed with ``exc`` if it is answered as the server's fault (5xx): a
    library error in one line (its message says what happened and what to do), anything
    else with its traceback (a bug of the server)."""
    if from_exception(exc).status < 500:
        return
    if isinstance(exc, InferScaleError):
        logger.error("%s failed: %s", what, exc)
    else:
        logger.error("%s failed", what, exc_info=exc)


def schema_error(exc: SchemaError) -> APIError:
    """A schema that cannot guide decoding, the engine's or a request check's: 400 naming
    the parameter, code ``schema_too_complex`` past a ``schema_limits`` bound, otherwise
    ``invalid_schema`` (a feature a grammar cannot express, or no grammar compiled)."""
    too_complex = getattr(exc, "limit", None) is not None  # SchemaLimitError's bound
    return APIError(400, str(exc), param=exc.param,
                    code="schema_too_complex" if too_complex else "invalid_schema")


def sse_error(exc: BaseException) -> bytes:
    """An error as a server-sent event (for failures after a stream has started)."""
    return f"data: {json.dumps(from_exception(exc).body())}\n\n".encode()


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "malformed JSON")
        return APIError(400, f"the request body is not valid JSON: {reason}",
                        code="invalid_json")
    loc = tuple(first.get("loc", ()))
    # A union's members each add an error under the field (`text.str`, `text.list[str]`):
    # the field is what the client got wrong.
    related = [tuple(e.get("loc", ())) for e in errors if tuple(e.get("loc", ()))[:2] == loc[:2]]
    if len(related) > 1:
        loc = loc[:len(os.path.commonprefix(related))]
    loc = [str(part) for part in loc if part not in ("body", "query", "path")]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return APIError(400, message, param=param, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    """Register the OpenAI-format handlers for every error on ``app``."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(InferScaleError)
    async def library_error(request: Request, exc: InferScaleError) -> JSONResponse:
        log_failure(f"{request.method} {request.url.path}", exc)
        return from_exception(exc).response()

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log_failure(f"{request.method} {request.url.path}", exc)
        return from_exception(exc).response()
