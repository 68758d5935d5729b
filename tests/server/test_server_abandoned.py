"""A chat whose client goes away is aborted in vLLM, streamed or not, and ``max_tokens``
is capped by the server's limit (issue: six clients that gave up after 1 s kept the engine
generating 18,000 tokens, and every other chat waited)."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest
from server_helpers import TIMEOUT, ask, assert_openai_error, http, requests_counted, wait_for_count

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

LONG = 3000  # tokens: about a minute of generation on a 2-core CPU


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def give_up_once_generating(server: ServerHandle, body: dict, engine: MemoryEngine,
                            stream: bool) -> None:
    """Send ``body``, wait, connected, until vLLM holds the chat, then drop the connection.

    The client stays connected however long the chat takes to reach vLLM: a watcher with
    a 30 s window started before the request, and a 3 s read timeout, let a chat that
    started late on a loaded machine look as if it never ran (the ``stream`` case failed
    so once in 4 fresh runs) or be dropped before vLLM had it."""
    url = httpx.URL(server.url)
    payload = json.dumps({**body, "stream": stream}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            "Authorization: Bearer key-admin\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((url.host, url.port), timeout=TIMEOUT) as sock:
        sock.sendall(head + payload)
        if stream:  # the server sends its headers with the engine's first token
            with sock.makefile("rb") as response:
                assert response.readline().startswith(b"HTTP/1.1 200")
        assert wait_until(lambda: engine.runtime.unfinished_requests() > 0, TIMEOUT), \
            "vLLM never held the chat"
    # the socket is closed: the client went away while its chat was generating


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_chat_whose_client_went_away_is_aborted(server: ServerHandle, engine: MemoryEngine,
                                                  model: str, stream: bool) -> None:
    assert engine.runtime.unfinished_requests() == 0
    body = {"model": model, "messages": ask("Count from one to ten thousand."),
            "max_tokens": LONG, "ignore_eos": True, "memory": {"mode": "off"}}
    give_up_once_generating(server, body, engine, stream)
    assert wait_until(lambda: engine.runtime.unfinished_requests() == 0, 10), \
        "the abandoned chat is still generating"
    with http(server) as client:  # and the server answers the next chat at once
        reply = client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2})
    assert reply.status_code == 200, reply.text


def test_an_abandoned_chat_is_counted_499_without_a_traceback(
        server: ServerHandle, engine: MemoryEngine, model: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A client that gives up is no server error: it was counted as a 500 with two
    tracebacks, so any client could fill the 5xx alerts and the log."""
    caplog.set_level(logging.WARNING)
    route = "/v1/chat/completions"
    before = requests_counted(server)
    body = {"model": model, "messages": ask("Count from one to ten thousand."),
            "max_tokens": LONG, "ignore_eos": True}
    give_up_once_generating(server, body, engine, stream=False)
    key = (route, "POST", "499")
    assert wait_for_count(server, key, before.get(key, 0)) == before.get(key, 0) + 1
    assert wait_until(lambda: engine.runtime.unfinished_requests() == 0, 10)
    after = requests_counted(server)
    assert not [k for k, v in after.items() if k[2].startswith("5") and v > before.get(k, 0)]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        caplog.text


def test_ignore_eos_generates_max_tokens(server: ServerHandle, model: str) -> None:
    with http(server) as client:
        reply = client.post("/chat/completions", json={
            "model": model, "messages": ask("Say yes."), "max_tokens": 24, "ignore_eos": True,
            "memory": {"mode": "off"}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 24
    assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_max_tokens_over_the_servers_limit_is_400(engine: MemoryEngine, model: str) -> None:
    from inferscale_memory.server import create_app, start_server

    handle = start_server(create_app(engine, max_tokens_limit=64), engine)
    try:
        with http(handle, key=None) as client:
            for field in ("max_tokens", "max_completion_tokens"):
                over = client.post("/chat/completions", json={
                    "model": model, "messages": ask("Hi"), field: 65})
                assert_openai_error(over, 400)
                assert over.json()["error"]["param"] == field
                assert "64" in over.json()["error"]["message"]
            within = client.post("/chat/completions", json={
                "model": model, "messages": ask("Hi"), "max_tokens": 64, "ignore_eos": True})
        assert within.status_code == 200, within.text
        assert within.json()["usage"]["completion_tokens"] == 64
    finally:
        handle.stop(timeout=60)
