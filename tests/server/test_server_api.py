"""The server's OpenAI-compatible chat and memories API, through real HTTP.

Chat goes through the official ``openai`` client; the memories API through httpx.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import add_facts, ask, assert_openai_error, http, openai_client

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine


def test_health_models_and_openapi(server: ServerHandle, model: str) -> None:
    with http(server, key=None) as client:
        assert client.get(f"{server.url}/health").json() == {"status": "ok", "model": model}
        spec = client.get(f"{server.url}/openapi.json").json()
    assert [m.id for m in openai_client(server).models.list().data] == [model]
    schemas = spec["components"]["schemas"]
    for name in ("ChatCompletionRequest", "ChatCompletion", "Usage", "MemoryOptions",
                 "Memory", "MemoryList", "AddMemoriesRequest", "SearchMemoriesRequest",
                 "UpdateMemoryRequest", "ErrorResponse"):
        assert name in schemas, name
    assert {"injected_tokens", "computed_prompt_tokens"} <= set(schemas["Usage"]["properties"])
    paths = spec["paths"]
    assert {"post", "get", "delete"} <= set(paths["/v1/memories"])
    assert {"get", "put", "delete"} <= set(paths["/v1/memories/{memory_id}"])
    assert "post" in paths["/v1/memories/search"]


def test_chat_with_the_openai_client(server: ServerHandle, model: str) -> None:
    reply = openai_client(server).chat.completions.create(
        model=model, messages=ask("Say hello."), max_tokens=8, temperature=0, seed=1)
    assert reply.object == "chat.completion" and reply.model == model
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.injected_tokens == 0  # type: ignore[attr-defined]
    assert usage.computed_prompt_tokens > 0  # type: ignore[attr-defined]
    assert reply.memory["mode"] == "off"  # type: ignore[attr-defined]
    assert reply.memory["memory_used"] is False  # type: ignore[attr-defined]


def test_streaming_with_the_openai_client(server: ServerHandle, model: str) -> None:
    add_facts(server, "srv-stream", "Milo's favourite fruit is the mango.")
    stream = openai_client(server).chat.completions.create(
        model=model, messages=ask("What is Milo's favourite fruit?"), max_tokens=12,
        user="srv-stream", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    assert finishing[0].memory["user"] == "srv-stream"  # type: ignore[attr-defined]
    assert len(finishing[0].memory["fact_ids"]) == 1  # type: ignore[attr-defined]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.injected_tokens > 0  # type: ignore[attr-defined]


def test_answer_uses_a_fact_added_through_the_memories_api(server: ServerHandle,
                                                          model: str) -> None:
    [fact] = add_facts(server, "srv-zora", "Zora's dog is called Pepper.")
    reply = openai_client(server).chat.completions.create(
        model=model, messages=ask("What is the name of Zora's dog?"), max_tokens=16,
        user="srv-zora", extra_body={"memory": {"k": 3, "mode": "kv"}})
    assert "Pepper" in (reply.choices[0].message.content or "")
    usage = reply.usage
    assert usage is not None
    assert usage.injected_tokens > 0  # type: ignore[attr-defined]
    assert usage.computed_prompt_tokens < usage.prompt_tokens  # type: ignore[attr-defined]
    assert reply.memory["fact_ids"] == [fact["id"]]  # type: ignore[attr-defined]
    assert reply.memory["recomputed_fact_ids"] == []  # type: ignore[attr-defined]
    assert reply.memory["memory_used"] is True  # type: ignore[attr-defined]
    text = openai_client(server).chat.completions.create(
        model=model, messages=ask("What is the name of Zora's dog?"), max_tokens=16,
        extra_headers={"X-Memory-User": "srv-zora"}, extra_body={"memory": {"mode": "text"}})
    assert text.usage is not None and text.usage.injected_tokens == 0  # type: ignore
    assert text.memory["fact_ids"] == [fact["id"]]  # type: ignore[attr-defined]


def answers_without_memory(server: ServerHandle) -> dict[str, float]:
    """``inferscale_chat_answers_without_memory_total`` by reason."""
    text = httpx.get(f"{server.url}/metrics").text
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "inferscale_chat_answers_without_memory_total"}


def test_a_user_without_facts_is_answered_without_memory(server: ServerHandle,
                                                        model: str) -> None:
    user = "srv-no-facts-yet"
    before = answers_without_memory(server)
    body = {"model": model, "messages": ask("Say hello to me."), "max_tokens": 4, "user": user}
    with http(server) as client:
        reply = client.post("/chat/completions", json=body)
        with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as events:
            assert events.status_code == 200
            chunks = [json.loads(line[6:]) for line in events.iter_lines()
                      if line.startswith("data: {")]
        assert_openai_error(client.get("/memories", params={"user_id": user}), 404,
                            "user_not_found")  # reading its facts is still a 404
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["injected_tokens"] == 0
    [finishing] = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    for memory in (answer["memory"], finishing["memory"]):
        assert memory["user"] == user and memory["fact_ids"] == []
        assert memory["memory_used"] is False
    after = answers_without_memory(server)
    assert after["no_facts"] == before.get("no_facts", 0) + 2
    assert after.get("off", 0) == before.get("off", 0)


def test_quality_levers_per_request(server: ServerHandle, model: str) -> None:
    facts = add_facts(server, "srv-levers", ["Ola's car is blue.", "Ola works as a nurse.",
                                             "Ola plays the violin every evening."])
    ids = [fact["id"] for fact in facts]

    def chat(memory: dict[str, object]) -> httpx.Response:
        with http(server) as client:
            return client.post("/chat/completions", json={
                "model": model, "messages": ask("Which instrument does Ola play?"),
                "max_tokens": 2, "user": "srv-levers", "memory": {"k": 3, **memory}})

    by_time = chat({"fact_order": "time"}).json()
    assert by_time["memory"]["fact_ids"] == ids  # oldest first
    by_rank = chat({"fact_order": "rank"}).json()
    with http(server) as client:
        hits = client.post("/memories/search", json={
            "user_id": "srv-levers", "query": "Which instrument does Ola play?", "k": 3}).json()
    best_first = [hit["id"] for hit in hits["data"]]
    assert best_first != ids  # else the two orders could not be told apart
    assert by_rank["memory"]["fact_ids"] == best_first[::-1]  # the best match last
    injected = [chat({"fact_order": "time", "recompute_tail": tail}).json()["usage"]
                ["injected_tokens"] for tail in (0, 3)]
    assert injected[0] > injected[1]  # the three facts computed, not injected
    for bad in ({"fact_order": "random"}, {"recompute_tail": -1},
                {"recompute_tail": "two"}):
        assert_openai_error(chat(bad), 400)

def test_logprobs(server: ServerHandle, model: str) -> None:
    reply = openai_client(server).chat.completions.create(
        model=model, messages=ask("Name a colour."), max_tokens=4, logprobs=True,
        top_logprobs=3)
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == reply.usage.completion_tokens  # type: ignore
    assert all(len(step.top_logprobs) == 3 and step.logprob <= 0 for step in content)
    assert all(step.logprob == max(top.logprob for top in step.top_logprobs)
               for step in content)  # greedy: the chosen token is the most likely


def test_memories_lifecycle(server: ServerHandle) -> None:
    user = "srv-crud"
    with http(server) as client:
        one = client.post("/memories", json={"user_id": user, "text": "Ada likes chess.",
                                             "metadata": {"source": "test"}})
        assert one.status_code == 201 and one.json()["data"][0]["metadata"] == {"source": "test"}
        batch = client.post("/memories", json={"user_id": user,
                                               "text": ["Ada lives in Lyon.", "Ada has a cat."]})
        ids = [m["id"] for m in one.json()["data"] + batch.json()["data"]]
        listed = client.get("/memories", params={"user_id": user}).json()["data"]
        assert [m["id"] for m in listed] == ids
        hits = client.post("/memories/search",
                           json={"user_id": user, "query": "Where does Ada live?", "k": 1})
        assert [m["text"] for m in hits.json()["data"]] == ["Ada lives in Lyon."]
        assert isinstance(hits.json()["data"][0]["score"], float)
        got = client.get(f"/memories/{ids[0]}", headers={"X-Memory-User": user})
        assert got.json()["text"] == "Ada likes chess."
        put = client.put(f"/memories/{ids[0]}", json={"user_id": user, "text": "Ada likes go."})
        assert put.json()["text"] == "Ada likes go."
        assert put.json()["metadata"] == {"source": "test"}
        history = client.get(f"/memories/{ids[0]}/history", params={"user_id": user}).json()
        assert [e["event"] for e in history["data"]] == ["ADD", "UPDATE"]
        deleted = client.delete(f"/memories/{ids[0]}", params={"user_id": user})
        assert deleted.json() == {"id": ids[0], "object": "memory.deleted", "deleted": True}
        assert_openai_error(client.get(f"/memories/{ids[0]}", params={"user_id": user}), 404,
                            "memory_not_found")
        assert_openai_error(client.delete(f"/memories/{ids[0]}", params={"user_id": user}), 404)
        wiped = client.delete("/memories", params={"user_id": user, "all": True}).json()
        assert wiped == {"object": "memory.deleted_all", "user_id": user, "deleted": 2}
        assert client.get("/memories", params={"user_id": user}).json()["data"] == []
        assert_openai_error(client.get("/memories", params={"user_id": "srv-nobody"}), 404,
                            "user_not_found")
        assert_openai_error(client.get("/memories"), 400, "missing_user")


def test_sampling_parameters_reach_vllm(server: ServerHandle, model: str) -> None:
    def answer(**sampling: Any) -> str:
        with http(server) as client:
            reply = client.post("/chat/completions", json={
                "model": model, "messages": ask("Name three colours."), "max_tokens": 16,
                "memory": {"mode": "off"}, "seed": 7, **sampling})
        assert reply.status_code == 200, reply.text
        return str(reply.json()["choices"][0]["message"]["content"])

    greedy = answer()
    assert answer(temperature=1.0) != greedy
    assert answer(temperature=1.0, top_k=1) == greedy
    assert answer(temperature=1.0, top_p=1e-9) == greedy
    assert answer(temperature=1.0, top_k=1, presence_penalty=2.0, frequency_penalty=-1.0)
