"""Property-based tests of the real server against its own OpenAPI document (schemathesis).

For every operation, valid and invalid requests generated from the document must get no
5xx, a documented status code, a documented content type and a body that matches the
documented schema; invalid ones must be refused (4xx); every ``/v1`` request without a
valid API key gets a 401. The engine must answer a chat afterwards.

Valid requests are steered past the first refusals (see :func:`tame`), and chat
completions are kept cheap: a schema-valid ``max_tokens`` may be any count (the server's
``max_tokens_limit`` and the context bound it), and at some ten milliseconds per token on
a CPU one such request would take minutes, so ``max_tokens`` above 4 is lowered to 4 (and
set to 4 when absent).

The chat's messages, tools and sampling options are shown with the engine's shapes and
checked by the engine alone (tests/server/test_server_chat_checks.py): an invalid one must
still be refused, now by the engine.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from server_helpers import add_facts, ask, http

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

ADMIN = {"Authorization": "Bearer key-admin"}
CHAT = "/v1/chat/completions"
SCHEMA_USER = "srv-schema"
WREN = ["Wren keeps bees.", "Wren's hives are on the roof.", "Wren sells honey on Fridays."]
MAX_TOKENS = 4
STEERED = "valid chat for the served model"
EXAMPLES = 15  # per operation and generation mode (valid requests, then invalid ones)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def tame(case: Any, model: str, fact_ids: list[str]) -> dict[str, str]:
    """Steer a generated request past the first refusals; return the headers to send.

    Only valid requests are changed. Two in three name the served model and a user with
    facts or none, leave out tools, structured output and tool messages (each generated
    JSON schema would have guided decoding compile a grammar; test_server_tools.py covers
    them), and end with a user message (chat), or name that user in the ``X-Memory-User``
    header instead of ``user_id`` and one of its real facts (memories);
    ``max_tokens`` above 4 is lowered to 4. Invalid requests are refused before they
    reach the engine.
    """
    headers = dict(ADMIN)
    if case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return headers  # an invalid request stays exactly as generated
    steer = zlib.crc32(repr((case.body, case.query, case.path_parameters)).encode()) % 3
    body = case.body if isinstance(case.body, dict) else {}
    if case.path == CHAT:
        if steer and body:
            body["model"] = model
            body["user"] = SCHEMA_USER if steer == 1 else None
            # Tools are covered by tests/server/test_server_tools.py (SmolLM2's own tool
            # prompt and a model with a tool template).
            for key in ("tools", "tool_choice", "parallel_tool_calls", "response_format",
                        "functions", "function_call"):
                body.pop(key, None)
            if isinstance(body.get("messages"), list) and len(body["messages"]) < 1024:
                body["messages"] = [  # content may be null only beside tool_calls
                    {**{k: v for k, v in m.items() if k != "tool_calls"},
                     "content": "Hi." if m.get("content") is None else m["content"]}
                    if isinstance(m, dict) else m for m in body["messages"]
                    if not (isinstance(m, dict) and m.get("role") == "tool")]
                body["messages"].append({"role": "user", "content": "Who keeps bees?"})
        lengths = [key for key in ("max_tokens", "max_completion_tokens") if key in body]
        if body and not lengths:
            body["max_tokens"] = MAX_TOKENS
        for key in lengths:
            value = body[key]
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                body[key] = MAX_TOKENS
    elif case.path.startswith("/v1/memories") and steer:
        body.pop("user_id", None)
        if case.query:
            case.query.pop("user_id", None)
        headers["X-Memory-User"] = SCHEMA_USER
        if case.path_parameters and "memory_id" in case.path_parameters:
            case.path_parameters["memory_id"] = fact_ids[steer % len(fact_ids)]
    return headers


def check_case(case: Any, model: str, fact_ids: list[str], seen: Counter[tuple[str, int]],
               refusals: list[str]) -> None:
    """Send one generated request with the admin key and without a valid key."""
    headers = tame(case, model, fact_ids)
    response = case.call(headers=headers, timeout=120)
    seen[(f"{case.method} {case.path}", response.status_code)] += 1
    if (case.path == CHAT and case.meta is not None
            and case.meta.generation.mode == GenerationMode.POSITIVE
            and isinstance(case.body, dict) and case.body.get("model") == model):
        seen[STEERED, response.status_code] += 1  # a valid chat for the served model
        if response.status_code != 200:
            refusals.append(response.text[:300])
    case.validate_response(response, checks=CHECKS, headers=headers)
    if case.path.startswith("/v1"):
        for bad in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "key-a"}):
            refused = case.call(headers=bad, timeout=120)
            assert refused.status_code == 401, (bad, refused.text)
            assert refused.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture
def constants_of_the_document(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hypothesis draws from the document alone, not from the package's source.

    Hypothesis (6.131 and later; 6.170 here) also draws strings and numbers from the
    literals of every local module imported so far (its providers' ``_get_local_constants``),
    so what this derandomized test sent changed with any literal anywhere in the package,
    and with the modules earlier tests had imported: a new module of the engine turned two
    of the PUT /v1/memories/{memory_id} requests that had been steered into unsteered ones.
    """
    from hypothesis.internal.conjecture import providers

    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants"):
        # private names of hypothesis 6.131-6.170: a version without them draws no local
        # constants, or another way, and is used as it is
        monkeypatch.setattr(providers, "_get_local_constants", providers.Constants)
    if cache is not None:
        cache.clear()  # allowed constants drawn from the old pool
    yield
    if cache is not None:
        cache.clear()


@pytest.mark.usefixtures("constants_of_the_document")
def test_server_conforms_to_its_openapi_document(server: ServerHandle, model: str) -> None:
    # schemathesis' pytest integration (schema.parametrize) does not run on pytest 9, so
    # each operation gets its own hypothesis run here; all failures are reported together.
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", timeout=60)
    failures, operations, runs, seen = {}, 0, 0, Counter[tuple[str, int]]()
    refusals: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        # Fresh facts for each operation: an earlier one may have deleted them all.
        fact_ids = [f["id"] for f in add_facts(server, SCHEMA_USER, WREN)]
        # Valid and invalid requests are generated apart: drawn from one strategy, the
        # valid ones were a few of each operation's examples, and how few changed with
        # the tests that ran before (a lone run and the suite differed).
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                check_case(case, model, fact_ids, seen, refusals)  # noqa: B023 - run below

            try:
                run()
            except Exception as exc:  # noqa: BLE001 - collected, reported below
                if isinstance(exc, Unsatisfiable) and mode == GenerationMode.NEGATIVE:
                    # no invalid request exists (no parameters, or a path string any
                    # text fills): only the valid ones are sent
                    continue
                failures[f"{operation.method.upper()} {operation.path} ({mode.value})"] = (
                    f"{type(exc).__name__}: {exc}"[:3000])
            runs += 1
    print(sorted(seen.items()))
    # A failed check first: hypothesis then shrinks, which skews the counts below.
    assert not failures, "\n\n".join(f"{op}:\n{text}" for op, text in failures.items())
    # Operations without parameters have one possible request, sent once.
    sent = sum(n for (key, _), n in seen.items() if key != STEERED)
    assert operations >= 12 and sent >= (runs - 3) * EXAMPLES
    # Answers, not only refusals: most valid chats for the served model are answered (how
    # many valid ones hypothesis draws differs between runs; some ask for what the server
    # refuses with a 400, such as logit_bias).
    answered = seen[STEERED, 200]
    steered = sum(n for (key, _), n in seen.items() if key == STEERED)
    assert answered >= 1 and answered >= steered / 2, (answered, steered, refusals)
    for operation in (
        "POST /v1/memories",
        "GET /v1/memories",
        "POST /v1/memories/search",
        "GET /v1/memories/{memory_id}",
        "PUT /v1/memories/{memory_id}",
    ):
        assert seen[operation, 200] + seen[operation, 201] >= 3, operation


def test_engine_serves_after_the_schema_tests(server: ServerHandle, model: str) -> None:
    with http(server) as client:
        response = client.post(
            "/chat/completions",
            json={"model": model, "messages": ask("Say hello."), "max_tokens": 4},
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
        assert client.get(f"{server.url}/health").json()["status"] == "ok"


def test_deeply_nested_json_is_a_400(server: ServerHandle, model: str) -> None:
    """JSON nested deeper than Python's recursion limit must not be a 500."""
    nested = b"[" * 100_000 + b"]" * 100_000
    body = b'{"user_id": "srv-deep", "text": "A fact.", "metadata": {"a": ' + nested + b"}}"
    with http(server) as client:
        for path, content in (("/memories", body), ("/chat/completions", nested)):
            response = client.post(
                path, content=content, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 400, response.text
        deep = {"a": 1}
        for _ in range(150):
            deep = {"a": deep}
        response = client.post(
            "/memories", json={"user_id": "srv-deep", "text": "A fact.", "metadata": deep}
        )
        assert response.status_code == 400 and "nested" in response.json()["error"]["message"]
        surrogate = client.post(
            "/memories",
            content=b'{"user_id": "srv-deep", "text": "bad \\ud800 fact"}',
            headers={"Content-Type": "application/json"},
        )
        assert surrogate.status_code == 400, surrogate.text
        response = client.post(
            "/chat/completions", json={"model": model, "messages": ask("Hi"), "max_tokens": 2}
        )
    assert response.status_code == 200
