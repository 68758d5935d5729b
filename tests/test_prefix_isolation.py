"""vLLM's prefix cache is no side channel between users: every request is salted.

An attacker who sends a guess of another user's prompt, or of a fact it stored, learns
whether the guess was right if vLLM serves the guess from blocks that the other user's
requests left in the prefix cache (``cached_tokens``, or the shorter TTFT). Each path is
walked here: the user's own repeat is served from the cache, another user's identical
prompt never is.
"""

from __future__ import annotations

import pytest

from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine

SECRET = ("Alice's bank PIN is 4417 and her vault code is 9902, written on the card in "
          "the blue drawer of the oak desk in the study, next to the spare keys for the "
          "garage, the bike lock and the cellar door, which she opens on Sundays only.")


def asked(engine: MemoryEngine, **options: object):
    """A plain answer (no facts) to a prompt of several KV blocks that holds SECRET."""
    words = (SECRET + " ") * (2 * engine.runtime.block_size // 40 + 1)
    return engine.chat([{"role": "user", "content": f"{words} What is the PIN?"}],
                       max_tokens=1, **options)  # type: ignore[arg-type]


def test_a_users_plain_prompt_is_cached_for_it_alone(engine: MemoryEngine) -> None:
    engine.reset_prefix_cache()
    asked(engine, user_id="iso-alice", memory=False, mode="text")
    assert asked(engine, user_id="iso-alice", memory=False,
                 mode="text").metrics.cached_tokens > 0
    # another user, on the text path or in "kv" mode without memory (the server's memory
    # "off"), and the anonymous user of requests that name none: no blocks of alice's
    assert asked(engine, user_id="iso-mallory", memory=False).metrics.cached_tokens == 0
    assert asked(engine, user_id="iso-eve", mode="text").metrics.cached_tokens == 0
    assert asked(engine).metrics.cached_tokens == 0


def test_a_captured_fact_is_not_served_to_another_users_guess(
        engine: MemoryEngine) -> None:
    fact = SECRET * 2  # capture prompt: header + fact, more than one block
    assert len(engine.builder.fact_ids(fact)) + len(engine.builder.header_ids) \
        > engine.runtime.block_size
    engine.reset_prefix_cache()
    engine.memory.add(fact, user_id="alice-facts")  # captured: header + fact in the cache
    # mallory stores the same text as a guess and asks on the text path: her prompt starts
    # with the very tokens of alice's capture prompt
    guess = engine.memory.add(fact, user_id="mallory-facts")
    question = [{"role": "user", "content": "What is the PIN?"}]
    engine.reset_prefix_cache()
    engine.memory.add(fact, user_id="alice-facts-2")
    reply = engine.answer(question, [guess], user_id="mallory-facts", mode="text",
                          max_tokens=1)
    assert reply.metrics.cached_tokens == 0
    again = engine.answer(question, [guess], user_id="mallory-facts", mode="text",
                          max_tokens=1)
    assert again.metrics.cached_tokens > 0  # her own prompt, repeated, is cached


def test_requests_without_a_user_share_no_blocks(engine: MemoryEngine) -> None:
    """Two callers that name no user are not one anonymous user: a repeat without
    ``user_id`` is computed again, one that names a user (memory off) is cached."""
    engine.reset_prefix_cache()
    asked(engine, memory=False)
    assert asked(engine, memory=False).metrics.cached_tokens == 0
    assert asked(engine, mode="text").metrics.cached_tokens == 0
    asked(engine, user_id="iso-named", memory=False)
    assert asked(engine, user_id="iso-named", memory=False).metrics.cached_tokens > 0
