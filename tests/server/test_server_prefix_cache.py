"""The server's chats do not share vLLM's prefix cache across users (two users' API
keys, the official OpenAI client): ``cached_tokens`` reveals only the caller's own
earlier prompts, also with memory off (see tests/test_prefix_isolation.py)."""

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
