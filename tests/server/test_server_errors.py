"""The status each library error is answered with, through the server's own handlers
(``install_handlers``) on a bare app: no engine, whose plain requests a test cannot make
vLLM fail (see ``test_a_request_vllm_ends_as_an_error_raises_request_failed`` in
tests/test_engine_tools.py). The table: docs/reliability.md, "Status by cause"."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from inferscale_memory.errors import (
    EngineDiedError,
    EngineError,
    RequestFailedError,
    SchemaError,
)
from inferscale_memory.server.errors import install_handlers, sse_error

CAUSES = [  # (error, status, code)
    (SchemaError("response_format: no grammar", "response_format"), 400, "invalid_schema"),
    (RequestFailedError("the engine failed request ism-1"), 500, "engine_request_failed"),
    (EngineError("vLLM is gone"), 503, "engine_unavailable"),
    (EngineDiedError("vLLM's engine core died"), 503, "engine_unavailable"),
]


def app_raising(error: Exception) -> TestClient:
    app = FastAPI()
    install_handlers(app)

    @app.get("/fail")
    async def fail() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(("error", "status", "code"), CAUSES,
                         ids=[type(c[0]).__name__ for c in CAUSES])
def test_each_cause_has_its_status_and_code(error: Exception, status: int, code: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="inferscale_memory.server.errors"):
        response = app_raising(error).get("/fail")
    assert response.status_code == status
    body = response.json()["error"]
    assert body["code"] == code and body["message"] == str(error)
    assert all(record.exc_info is None for record in caplog.records)  # no traceback


def test_a_request_vllm_failed_is_500_engine_request_failed_not_a_bare_500() -> None:
    """It was a 500 with no code and a message that said only "the engine failed the
    request" (the server's own check of ``finish_reason``); streamed, the same body."""
    error = RequestFailedError("the engine failed request ism-7: vLLM ended it with "
                               'finish_reason "error"')
    body = app_raising(error).get("/fail").json()["error"]
    assert body == {"message": str(error), "type": "server_error", "param": None,
                    "code": "engine_request_failed"}
    event = sse_error(error).decode()
    assert event.startswith("data: ") and json.loads(event[6:])["error"] == body
