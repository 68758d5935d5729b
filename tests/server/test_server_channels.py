"""Channels besides the answer that could tell one user about another (see
docs/reliability.md): a fact id of another user looks exactly like an unknown one,
``/metrics`` and ``/health`` (no API key needed) name no user, fact or id, and error
messages never name another user."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import USER_A, USER_B, add_facts, ask, http

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

SECRET = "User B keeps the spare key under the third flowerpot."
LABELS = {"route", "method", "status", "mode", "op", "le", "reason"}
REASONS = {"off", "no_facts"}  # why an answer used no memory: never who asked


def by_id(client: httpx.Client, method: str, fact_id: str) -> httpx.Response:
    path = f"/memories/{fact_id}"
    if method == "PUT":
        return client.put(path, json={"user_id": USER_A, "text": "Overwritten."})
    if method == "HISTORY":
        return client.get(path + "/history", params={"user_id": USER_A})
    return client.request(method, path, params={"user_id": USER_A})


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "HISTORY"])
def test_another_users_fact_id_looks_like_an_unknown_one(server: ServerHandle,
                                                           method: str) -> None:
    add_facts(server, USER_A, "User A likes green tea.", key="key-a")
    [theirs] = add_facts(server, USER_B, SECRET, key="key-b")
    unknown = str(uuid.uuid4())
    with http(server, "key-a") as client:
        other = by_id(client, method, theirs["id"])
        missing = by_id(client, method, unknown)
    assert other.status_code == missing.status_code == 404
    assert other.headers.get("content-type") == missing.headers.get("content-type")
    assert other.text.replace(theirs["id"], "ID") == missing.text.replace(unknown, "ID")
    assert USER_B not in other.text and SECRET not in other.text
    with http(server, "key-b") as client:  # and the fact is untouched
        mine = client.get(f"/memories/{theirs['id']}", params={"user_id": USER_B})
    assert mine.status_code == 200 and mine.json()["text"] == SECRET


def test_metrics_and_health_name_no_user_fact_or_id(server: ServerHandle,
                                                      model: str) -> None:
    user = f"chan-{uuid.uuid4().hex[:8]}"
    [fact] = add_facts(server, user, SECRET)
    with http(server) as client:
        assert client.get(f"/memories/{fact['id']}", params={"user_id": user}).status_code \
            == 200
        assert client.post("/chat/completions", json={
            "model": model, "user": user, "messages": ask("Where is the key?"),
            "max_tokens": 2}).status_code == 200
    anonymous = httpx.Client(base_url=server.url, timeout=60)
    metrics, health = anonymous.get("/metrics"), anonymous.get("/health")
    anonymous.close()
    assert metrics.status_code == 200 and health.status_code == 200
    for leak in (user, fact["id"], "spare key", USER_A, USER_B):
        assert leak not in metrics.text and leak not in health.text
    names: set[str] = set()
    routes: set[str] = set()
    for family in text_string_to_metric_families(metrics.text):
        for sample in family.samples:
            names.update(sample.labels)
            routes.update(v for k, v in sample.labels.items() if k == "route")
            assert sample.labels.get("reason", "off") in REASONS, sample
    assert names <= LABELS, names - LABELS  # no per-user series to difference
    assert "/v1/memories/{memory_id}" in routes  # ids are counted under the template
    assert set(health.json()) == {"status", "model"}


@pytest.mark.parametrize(("key", "request_"), [
    ("key-a", {"method": "GET", "url": "/memories", "params": {"user_id": USER_B}}),
    ("key-a", {"method": "POST", "url": "/memories/search",
               "json": {"user_id": USER_B, "query": "key"}}),
    ("key-a", {"method": "POST", "url": "/chat/completions",
               "json": {"model": "m", "user": USER_B, "messages": ask("Hi")}}),
    ("key-b", {"method": "GET", "url": "/memories/x", "params": {"user_id": "nobody-at-all"}}),
])
def test_error_messages_name_only_what_the_caller_sent(server: ServerHandle, key: str,
                                                       request_: dict[str, Any]) -> None:
    add_facts(server, USER_B, SECRET, key="key-b")
    with http(server, key) as client:
        response = client.request(**request_)
    assert 400 <= response.status_code < 500
    sent = str(request_)
    for other in (USER_A, USER_B, SECRET):
        if other not in sent:
            assert other not in response.text
