"""Concurrent clients, tenant isolation and API keys on the real server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
from server_helpers import (
    TENANT_A,
    TENANT_B,
    add_facts,
    ask,
    assert_openai_error,
    http,
    openai_client,
)

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

OWNERS = ["Anna", "Ben", "Carl", "Dora", "Emil", "Fay", "Gus", "Hana"]
PETS = ["Biscuit", "Mango", "Luna", "Rocky", "Coco", "Ziggy", "Nala", "Oscar"]


def test_eight_concurrent_clients_get_their_own_facts(server: ServerHandle, model: str) -> None:
    users = [f"srv-conc-{i}" for i in range(8)]
    fact_ids = {}
    for user, owner, pet in zip(users, OWNERS, PETS, strict=True):
        [fact] = add_facts(server, user, f"{owner}'s dog is called {pet}.")
        fact_ids[user] = fact["id"]

    def chat(i: int) -> Any:
        client = openai_client(server)
        return client.chat.completions.create(
            model=model, messages=ask(f"What is the name of {OWNERS[i]}'s dog?"),
            max_tokens=12, user=users[i], extra_body={"memory": {"k": 5}})

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(chat, range(8)))
    correct = 0
    for user, pet, reply in zip(users, PETS, replies, strict=True):
        assert reply.memory["user"] == user  # type: ignore[attr-defined]
        assert reply.memory["fact_ids"] == [fact_ids[user]]  # type: ignore[attr-defined]
        assert reply.usage.injected_tokens > 0  # type: ignore[union-attr]
        correct += pet in (reply.choices[0].message.content or "")
    assert correct == 8, [r.choices[0].message.content for r in replies]


def test_a_key_bound_to_a_tenant_cannot_touch_another(server: ServerHandle, model: str) -> None:
    [secret] = add_facts(server, TENANT_B, "The vault code of Bea is 7319.", key="key-b")
    [own] = add_facts(server, TENANT_A, "Al keeps his keys in a blue box.", key="key-a")
    with http(server, "key-a") as client:
        for response in (
            client.get("/memories", params={"user_id": TENANT_B}),
            client.post("/memories", json={"user_id": TENANT_B, "text": "Injected."}),
            client.post("/memories/search", json={"user_id": TENANT_B, "query": "vault"}),
            client.get(f"/memories/{secret['id']}", params={"user_id": TENANT_B}),
            client.delete("/memories", params={"user_id": TENANT_B}),
            client.get("/memories", headers={"X-Memory-User": TENANT_B}),
            client.post("/chat/completions", json={"model": model, "user": TENANT_B,
                                                   "messages": ask("Hi")}),
        ):
            assert_openai_error(response, 403, "tenant_forbidden")
        # B's fact id under A's own tenant: not found, and not deleted.
        assert_openai_error(client.get(f"/memories/{secret['id']}"), 404, "memory_not_found")
        assert_openai_error(client.delete(f"/memories/{secret['id']}"), 404)
        # The key's only tenant is the default; A's chats only ever use A's facts.
        listed = client.get("/memories").json()["data"]
        assert [m["id"] for m in listed] == [own["id"]]
    reply = openai_client(server, "key-a").chat.completions.create(
        model=model, messages=ask("What is the vault code of Bea?"), max_tokens=8,
        extra_body={"memory": {"k": 10}})
    assert reply.memory["user"] == TENANT_A  # type: ignore[attr-defined]
    assert reply.memory["fact_ids"] == [own["id"]]  # type: ignore[attr-defined]
    assert "7319" not in (reply.choices[0].message.content or "")
    with http(server, "key-b") as client:
        assert client.get("/memories").json()["data"][0]["id"] == secret["id"]


def test_api_keys_are_required(server: ServerHandle, model: str) -> None:
    body = {"model": model, "messages": ask("Hi"), "max_tokens": 1}
    with http(server, key=None) as client:
        assert_openai_error(client.post("/chat/completions", json=body), 401, "invalid_api_key")
        assert_openai_error(client.get("/models"), 401, "invalid_api_key")
        assert_openai_error(client.get("/memories", headers={"Authorization": "Basic a2V5"}),
                            401)
        assert client.get(f"{server.url}/health").status_code == 200  # open for probes
    with http(server, key="key-wrong") as client:
        assert_openai_error(client.post("/chat/completions", json=body), 401)
    with http(server, "key-a", **{"X-Memory-User": TENANT_A}) as client:
        assert_openai_error(client.post("/chat/completions", json={**body, "user": TENANT_B}),
                            400, "user_mismatch")
