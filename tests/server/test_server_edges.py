"""Small robustness edges of the server: what a dropped upload and a 401 are counted as,
non-ASCII users in the header, strict types and a byte order mark in the body."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest
from server_helpers import (
    add_facts,
    ask,
    assert_openai_error,
    http,
    requests_counted,
    wait_for_count,
)

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"


def test_a_client_that_drops_its_upload_is_499_not_500(server: ServerHandle) -> None:
    before = requests_counted(server)
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port)) as sock:
        sock.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer key-admin\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\": ")
        time.sleep(0.3)  # the server is reading the body: the client goes away
    key = (CHAT, "POST", "499")
    assert wait_for_count(server, key, before.get(key, 0)) == before.get(key, 0) + 1
    after = requests_counted(server)
    assert not [k for k, v in after.items() if k[2].startswith("5") and v > before.get(k, 0)]


def test_a_401_is_counted_under_its_route(server: ServerHandle, model: str) -> None:
    key = (CHAT, "POST", "401")
    before = requests_counted(server).get(key, 0)
    with http(server, key=None) as client:
        assert client.post("/chat/completions", json={
            "model": model, "messages": ask("Hi")}).status_code == 401
    assert wait_for_count(server, key, before) == before + 1


def test_a_non_ascii_user_in_the_header_is_utf8(server: ServerHandle) -> None:
    add_facts(server, "zoë", "Zoë collects blue teapots.")
    with http(server) as client:
        listed = client.get("/memories", headers={"X-Memory-User": "zoë".encode()})
        assert listed.status_code == 200, listed.text
        assert [m["text"] for m in listed.json()["data"]] == ["Zoë collects blue teapots."]
        assert {m["user_id"] for m in listed.json()["data"]} == {"zoë"}
        broken = client.get("/memories", headers={"X-Memory-User": b"zo\xeb"})  # Latin-1
    assert_openai_error(broken, 400, "invalid_user_header")
    assert "user_id" in broken.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/chat/completions", {"stream": "yes"}, "stream"),
    ("/chat/completions", {"memory": {"k": True}}, "memory.k"),
    ("/chat/completions", {"temperature": "0.5"}, "temperature"),
    ("/chat/completions", {"max_tokens": 4.0}, "max_tokens"),
    ("/chat/completions", {"logprobs": "true"}, "logprobs"),
    ("/memories/search", {"user_id": "u", "query": "q", "k": "3"}, "k"),
    ("/memories", {"user_id": "u", "text": 42}, "text"),
], ids=["stream-str", "k-bool", "temperature-str", "max_tokens-float", "logprobs-str",
        "search-k-str", "text-int"])
def test_no_type_coercion(server: ServerHandle, model: str, path: str, body: dict,
                          param: str) -> None:
    if path == "/chat/completions":
        body = {"model": model, "messages": ask("Hi"), "max_tokens": 2, **body}
    with http(server) as client:
        response = client.post(path, json=body)
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param


def test_a_body_with_a_byte_order_mark_is_400(server: ServerHandle, model: str) -> None:
    body = b'\xef\xbb\xbf{"model": "' + model.encode() + b'", "max_tokens": 2, ' \
        b'"messages": [{"role": "user", "content": "Hi"}]}'
    with http(server) as client:
        response = client.post("/chat/completions", content=body,
                               headers={"Content-Type": "application/json"})
        assert_openai_error(response, 400, "invalid_json")
        assert "byte order mark" in response.json()["error"]["message"]
        good = client.post("/chat/completions", content=body[3:],
                           headers={"Content-Type": "application/json"})
    assert good.status_code == 200, good.text


@pytest.mark.parametrize("keys", [("key-a", "key-b"), ("key-b", "key-a"),
                                  ("key-a", "wrong"), ("wrong", "key-admin")],
                         ids=["a-b", "b-a", "a-wrong", "wrong-admin"])
def test_two_authorization_headers_are_refused(server: ServerHandle, model: str,
                                               keys: tuple[str, str]) -> None:
    """A proxy in front that reads the other header than the server must not be able to
    disagree with it about who sent the request."""
    headers = [("Authorization", f"Bearer {key}") for key in keys]
    with httpx.Client(base_url=f"{server.url}/v1", timeout=60) as client:
        chat = client.post("/chat/completions", headers=headers, json={
            "model": model, "messages": ask("Hi"), "max_tokens": 2})
        listed = client.get("/memories", headers=headers, params={"user_id": "srv-user-a"})
    for response in (chat, listed):
        assert_openai_error(response, 400, "multiple_authorization_headers")


def test_two_user_headers_are_refused(server: ServerHandle) -> None:
    with httpx.Client(base_url=f"{server.url}/v1", timeout=60) as client:
        response = client.get("/memories", headers=[
            ("Authorization", "Bearer key-admin"), ("X-Memory-User", "srv-user-a"),
            ("X-Memory-User", "srv-user-b")])
    assert_openai_error(response, 400, "multiple_user_headers")
