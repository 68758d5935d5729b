"""Concurrent clients, user isolation and API keys on the real server; thousands of
random requests of several users, with forged fact ids and forged KV parameters, through
the Python API and HTTP: nothing of another user is ever retrieved, injected or echoed."""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from server_helpers import (
    USER_A,
    USER_B,
    add_facts,
    ask,
    assert_openai_error,
    http,
    openai_client,
)

from inferscale_memory import FactNotFoundError, InvalidInputError

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
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
            model=model,
            messages=ask(f"What is the name of {OWNERS[i]}'s dog?"),
            max_tokens=12,
            user=users[i],
            extra_body={"memory": {"k": 5}},
        )

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(chat, range(8)))
    correct = 0
    for user, pet, reply in zip(users, PETS, replies, strict=True):
        assert reply.memory["user"] == user  # type: ignore[attr-defined]
        assert reply.memory["fact_ids"] == [fact_ids[user]]  # type: ignore[attr-defined]
        assert reply.usage.injected_tokens > 0  # type: ignore[union-attr]
        correct += pet in (reply.choices[0].message.content or "")
    assert correct == 8, [r.choices[0].message.content for r in replies]


@pytest.mark.usefixtures("fresh_users")
def test_a_key_bound_to_a_user_cannot_touch_another(server: ServerHandle, model: str) -> None:
    [secret] = add_facts(server, USER_B, "The vault code of Bea is 7319.", key="key-b")
    [own] = add_facts(server, USER_A, "Al keeps his keys in a blue box.", key="key-a")
    with http(server, "key-a") as client:
        for response in (
            client.get("/memories", params={"user_id": USER_B}),
            client.post("/memories", json={"user_id": USER_B, "text": "Injected."}),
            client.post("/memories/search", json={"user_id": USER_B, "query": "vault"}),
            client.get(f"/memories/{secret['id']}", params={"user_id": USER_B}),
            client.delete("/memories", params={"user_id": USER_B, "all": True}),
            client.get("/memories", headers={"X-Memory-User": USER_B}),
            client.post(
                "/chat/completions", json={"model": model, "user": USER_B, "messages": ask("Hi")}
            ),
        ):
            assert_openai_error(response, 403, "user_forbidden")
        # B's fact id under A's own user: not found, and not deleted.
        assert_openai_error(client.get(f"/memories/{secret['id']}"), 404, "memory_not_found")
        assert_openai_error(client.delete(f"/memories/{secret['id']}"), 404)
        # The key's only user is the default; A's chats only ever use A's facts.
        listed = client.get("/memories").json()["data"]
        assert [m["id"] for m in listed] == [own["id"]]
    reply = openai_client(server, "key-a").chat.completions.create(
        model=model,
        messages=ask("What is the vault code of Bea?"),
        max_tokens=8,
        extra_body={"memory": {"k": 10}},
    )
    assert reply.memory["user"] == USER_A  # type: ignore[attr-defined]
    assert reply.memory["fact_ids"] == [own["id"]]  # type: ignore[attr-defined]
    assert "7319" not in (reply.choices[0].message.content or "")
    with http(server, "key-b") as client:
        assert client.get("/memories").json()["data"][0]["id"] == secret["id"]


def test_api_keys_are_required(server: ServerHandle, model: str) -> None:
    body = {"model": model, "messages": ask("Hi"), "max_tokens": 1}
    with http(server, key=None) as client:
        assert_openai_error(client.post("/chat/completions", json=body), 401, "invalid_api_key")
        assert_openai_error(client.get("/models"), 401, "invalid_api_key")
        assert_openai_error(client.get("/memories", headers={"Authorization": "Basic a2V5"}), 401)
        assert client.get(f"{server.url}/health").status_code == 200  # open for probes
    with http(server, key="key-wrong") as client:
        assert_openai_error(client.post("/chat/completions", json=body), 401)
    with http(server, "key-a", **{"X-Memory-User": USER_A}) as client:
        assert_openai_error(
            client.post("/chat/completions", json={**body, "user": USER_B}), 400, "user_mismatch"
        )


# -- adversarial isolation: many random requests, forged ids and forged KV parameters --------

USERS = [f"adv-{i}" for i in range(4)]
SEED = 8


class Users:
    """Each user's facts, each holding the user's secret word; what must never leak."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.ids = {
            user: {
                f.id
                for f in engine.memory.add(
                    [
                        f"{secret(user)} note {j}: the {user} locker holds item {j}."
                        for j in range(6)
                    ],
                    user_id=user,
                )
            }
            for user in USERS
        }

    def others(self, user: str) -> list[str]:
        return sorted(i for t, ids in self.ids.items() if t != user for i in ids)

    def assert_no_leak(self, user: str, seen: Any, sent: str = "") -> None:
        """``seen`` (any result, error or response text) holds no text and no id of
        another user's facts, except the forged id ``sent`` echoed in a not-found error."""
        text = seen if isinstance(seen, str) else repr(seen)
        for other in USERS:
            if other != user:
                assert secret(other) not in text, f"{user} saw {other}'s fact: {text:.300}"
        for fact_id in self.others(user):
            assert fact_id == sent or fact_id not in text, f"{user} saw {fact_id}"


@pytest.fixture(scope="module")
def adversaries(engine: MemoryEngine) -> Users:
    return Users(engine)


def secret(user: str) -> str:
    return f"SECRET{user.upper().replace('-', '')}"


def python_call(
    engine: MemoryEngine, users: Users, rng: random.Random, user: str
) -> tuple[Any, str]:
    """One random memory call of ``user``; returns (result or error, forged id sent).

    Mostly reads and writes naming other users' fact ids; a few writes of its own.
    """
    own, forged = sorted(users.ids[user]), rng.choice(users.others(user))
    memory, roll = engine.memory, rng.random()
    try:
        if roll < 0.02:
            fact = memory.add(f"{secret(user)} extra {rng.random()}", user_id=user)
            users.ids[user].add(fact.id)
            return fact, ""
        if roll < 0.04:
            return memory.update(rng.choice(own), f"{secret(user)} moved", user_id=user), ""
        if roll < 0.05 and len(own) > 3:
            users.ids[user].discard(gone := rng.choice(own))
            return memory.delete(gone, user_id=user), ""
        if roll < 0.3:
            query = f"{rng.choice(['locker', 'item', 'note'])} {secret(rng.choice(USERS))}"
            return memory.search(query, user_id=user, k=rng.choice([1, 5, 50])), ""
        if roll < 0.45:
            return memory.list(user_id=user), ""
        if roll < 0.55:
            return memory.get(rng.choice(own), user_id=user), ""
        if roll < 0.7:
            return memory.get(forged, user_id=user), forged
        if roll < 0.8:
            return memory.history(forged, user_id=user), forged
        if roll < 0.9:
            return memory.update(forged, f"{secret(user)} hijack", user_id=user), forged
        return memory.delete(forged, user_id=user), forged
    except FactNotFoundError as exc:
        return exc, forged


def test_random_python_calls_never_cross_users(
    engine: MemoryEngine, adversaries: Users
) -> None:
    rng, users = random.Random(SEED), adversaries
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        user = rng.choice(USERS)
        result, sent = python_call(engine, users, rng, user)
        outcomes[type(result).__name__] += 1
        users.assert_no_leak(user, result, sent)
        for item in result if isinstance(result, list) else [result]:
            fact = getattr(item, "fact", item)
            owner = fact["user_id"] if isinstance(fact, dict) else getattr(fact, "user_id", user)
            assert owner == user, (user, item)
    assert outcomes["FactNotFoundError"] > 1000 and outcomes["list"] > 1000, outcomes
    # Every forged update and delete was refused; each user holds exactly its own writes.
    for user in USERS:
        facts = engine.memory.list(user_id=user)
        assert {f.id for f in facts} == users.ids[user]
        assert all(f.text.startswith(secret(user)) for f in facts)
    question = [{"role": "user", "content": "What does my locker hold?"}]
    for user in USERS:
        reply = engine.chat(question, user_id=user, k=10, max_tokens=8)
        assert set(reply.metrics.fact_ids) <= users.ids[user]
        assert {f.fact.user_id for f in reply.facts} == {user}
        users.assert_no_leak(user, reply.metrics)
    with pytest.raises(InvalidInputError, match="unknown options"):
        engine.chat(question, user_id=USERS[0], kv_transfer_params={"inferscale": {}})


def forged_inject(engine: MemoryEngine, victim: str, fact_id: str, text: str) -> dict[str, Any]:
    """``kv_transfer_params`` that would inject the victim's fact into a prompt."""
    layout = engine.builder.build(ask("What does the locker hold?"), [(fact_id, text)])
    spans = [
        ["", engine.builder.header_name, 0, layout.header_end],
        [victim, fact_id, *layout.fact_spans[0][1:]],
    ]
    return {"inferscale": {"user": victim, "layout": layout.layout_id, "inject": spans}}


def test_random_http_requests_never_cross_users(
    engine: MemoryEngine, model: str, adversaries: Users
) -> None:
    from inferscale_memory.server import create_app, start_server

    rng, users = random.Random(SEED + 1), adversaries
    keys = {f"key-{t}": [t] for t in USERS}
    handle = start_server(create_app(engine, keys, metrics_refresh_s=0), engine)
    statuses: Counter[int] = Counter()
    try:
        clients = {
            t: httpx.Client(
                base_url=f"{handle.url}/v1",
                timeout=120,
                headers={"Authorization": f"Bearer key-{t}"},
            )
            for t in USERS
        }
        for _ in range(800):
            user = rng.choice(USERS)
            response, sent = http_call(clients[user], users, rng, user)
            statuses[response.status_code] += 1
            assert response.status_code in (200, 403, 404), response.text
            users.assert_no_leak(user, response.text, sent)
            if response.status_code == 200:
                assert {m["user_id"] for m in response.json()["data"]} <= {user}
        for user in USERS:  # chats, one with forged KV parameters in the body
            victim = rng.choice([t for t in USERS if t != user])
            fact_id = sorted(users.ids[victim])[0]
            text = engine.store.get(fact_id, user_id=victim).text
            for extra in ({}, {"kv_transfer_params": forged_inject(engine, victim, fact_id, text)}):
                body = {
                    "model": model,
                    "messages": ask("What does the locker hold?"),
                    "max_tokens": 8,
                    "memory": {"mode": "text", "k": 3},
                    **extra,
                }
                response = clients[user].post("/chat/completions", json=body)
                assert response.status_code == 200, response.text
                data = response.json()
                assert set(data["memory"]["fact_ids"]) <= users.ids[user]
                assert data["usage"]["injected_tokens"] == 0  # text mode: nothing injected
                users.assert_no_leak(user, response.text)
            forged = clients[user].post("/chat/completions", json={**body, "user": victim})
            assert forged.status_code == 403
    finally:
        for client in clients.values():
            client.close()
        handle.stop(timeout=60)
    assert statuses[200] > 150 and statuses[403] > 100 and statuses[404] > 200, statuses
    assert {t: {f.id for f in engine.memory.list(user_id=t)} for t in USERS} == users.ids


def http_call(
    client: httpx.Client, users: Users, rng: random.Random, user: str
) -> tuple[httpx.Response, str]:
    """One random request of ``user``'s key; returns (response, forged id sent)."""
    forged = rng.choice(users.others(user))
    other = rng.choice([t for t in USERS if t != user])
    roll = rng.random()
    if roll < 0.25:
        body = {"query": f"locker {secret(other)}", "k": rng.choice([1, 10])}
        if rng.random() < 0.3:
            body["user_id"] = other  # 403
        return client.post("/memories/search", json=body), ""
    if roll < 0.4:
        params = {"user_id": other} if rng.random() < 0.3 else {}
        return client.get("/memories", params=params), ""
    if roll < 0.5:
        return client.get("/memories", headers={"X-Memory-User": other}), ""
    if roll < 0.65:
        return client.get(f"/memories/{forged}"), forged
    if roll < 0.75:
        return client.get(f"/memories/{forged}/history"), forged
    if roll < 0.85:
        return client.put(f"/memories/{forged}", json={"text": "hijacked"}), forged
    if roll < 0.95:
        return client.delete(f"/memories/{forged}"), forged
    return client.delete(f"/memories/{forged}", params={"user_id": other}), forged
