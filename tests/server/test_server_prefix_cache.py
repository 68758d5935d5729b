"""The server's chats do not share vLLM's prefix cache across users (two users' API
keys, the official OpenAI client): ``cached_tokens`` reveals only the caller's own
earlier prompts, also with memory off (see tests/test_prefix_isolation.py); a chat that
names no user is salted for its API key (keys bound to a team, or to every user)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from server_helpers import USER_A, USER_B, openai_client

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

GUESS = ("User A's bank PIN is 4417 and the vault code is 9902, written on a card in "
         "the blue drawer of the oak desk in the study, next to the spare garage keys. ")


def cached_tokens(server: ServerHandle, model: str, key: str, prompt: str,
                  **options: object) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a one-token answer to ``prompt``."""
    reply = openai_client(server, key).chat.completions.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": prompt}],
        **options)  # type: ignore[call-overload]
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


@pytest.mark.parametrize("memory", [{"mode": "off"}, {"mode": "text"}, {"mode": "kv"}])
def test_another_users_identical_prompt_is_not_served_from_the_cache(
        server: ServerHandle, engine: MemoryEngine, model: str, memory: dict) -> None:
    words = GUESS * (2 * engine.runtime.block_size // 30 + 1)

    def cached(key: str, user: str) -> int:
        reply = openai_client(server, key).chat.completions.create(
            model=model, user=user, max_tokens=1, extra_body={"memory": memory},
            messages=[{"role": "user", "content": f"{words} What is the PIN?"}])
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        return reply.usage.prompt_tokens_details.cached_tokens or 0

    engine.reset_prefix_cache()
    cached("key-a", USER_A)
    assert cached("key-a", USER_A) > 0  # the user's own repeat
    assert cached("key-b", USER_B) == 0  # another user's guess of it


@pytest.mark.parametrize("memory", [None, {"mode": "off"}], ids=["default", "off"])
@pytest.mark.parametrize(("owner", "prober"), [
    ("key-team2", "key-team1"), ("key-team1", "key-admin"), ("key-admin", "key-team2")],
    ids=["team-team", "team-admin", "admin-team"])
def test_a_chat_without_a_user_is_cached_for_its_key_alone(
        server: ServerHandle, engine: MemoryEngine, model: str, memory: dict | None,
        owner: str, prober: str) -> None:
    """Keys bound to several users (or all) that name none: once salted with one shared
    anonymous salt, so one team could confirm another team's prompt (cached 1152 of a
    1,200-token prompt with the right PIN, 0 with another)."""
    prompt = GUESS * (2 * engine.runtime.block_size // 30 + 1) + " What is the PIN?"
    options = {"extra_body": {"memory": memory}} if memory else {}
    engine.reset_prefix_cache()
    cached_tokens(server, model, owner, prompt, **options)
    assert cached_tokens(server, model, owner, prompt, **options) > 0  # the key's own repeat
    assert cached_tokens(server, model, prober, prompt, **options) == 0  # another key's guess
