"""Helpers of the server tests: HTTP and OpenAI clients of a running server, checks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from openai import OpenAI

    from inferscale_memory.server import ServerHandle

USER_A, USER_B = "srv-user-a", "srv-user-b"
TEAM_1, TEAM_2 = ["srv-team1-a", "srv-team1-b"], ["srv-team2-c", "srv-team2-d"]
KEYS = {"key-admin": "*", "key-a": [USER_A], "key-b": [USER_B],
        "key-team1": TEAM_1, "key-team2": TEAM_2}
TIMEOUT = 120.0


def http(server: ServerHandle, key: str | None = "key-admin", **headers: str) -> httpx.Client:
    """An HTTP client of the server's /v1 API with ``key`` as bearer token."""
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=f"{server.url}/v1", headers=headers, timeout=TIMEOUT)


def openai_client(server: ServerHandle, key: str = "key-admin") -> OpenAI:
    """The official client pointed at the server."""
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


def add_facts(server: ServerHandle, user: str, text: str | list[str],
              key: str = "key-admin") -> list[dict[str, Any]]:
    """Add facts through the API; return the created memories."""
    with http(server, key) as client:
        response = client.post("/memories", json={"user_id": user, "text": text})
    assert response.status_code == 201, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def requests_counted(server: ServerHandle) -> dict[tuple[str, str, str], float]:
    """``inferscale_http_requests_total`` by (route, method, status)."""
    text = httpx.get(f"{server.url}/metrics").text
    return {(s.labels["route"], s.labels["method"], s.labels["status"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "inferscale_http_requests_total"}


def wait_for_count(server: ServerHandle, key: tuple[str, str, str], above: float) -> float:
    """The count of ``key`` once it exceeds ``above`` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while (value := requests_counted(server).get(key, 0)) <= above \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    """``response`` is an OpenAI-format error with ``status`` (and ``code``)."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if code is not None:
        assert error["code"] == code, error
