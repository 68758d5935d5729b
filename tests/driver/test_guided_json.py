"""Guided JSON's grammar without an engine: the separators instruct models write, no other
whitespace, vLLM's refusals kept, converted off the event loop and once per schema.

The grammar is matched against strings with xgrammar's own test helper; what a real engine
writes under it: ``tests/test_engine_guided_json.py``.
"""

from __future__ import annotations

import asyncio
import doctest
import json
import os
import time
import uuid

import pytest

pytest.importorskip("vllm")

import xgrammar as xgr  # noqa: E402  (vLLM's dependency)
from xgrammar.testing import _is_grammar_accept_string  # noqa: E402

from inferscale_memory.driver import guided_json  # noqa: E402
from inferscale_memory.driver.frontend import request_validation_errors  # noqa: E402
from inferscale_memory.driver.guided_json import as_grammar, json_grammar  # noqa: E402

SCHEMA = {"type": "object", "required": ["a", "b"], "additionalProperties": False,
          "properties": {"a": {"type": "array", "items": {"type": "integer"}},
                         "b": {"type": "string"}}}


def slow_schema(names: int = 20) -> dict[str, object]:
    """A schema whose conversion takes about a second here, with names of its own (no
    earlier conversion in this process serves it)."""
    keys = [f"p{i}{uuid.uuid4().hex[:6]}" for i in range(names)]
    return {"type": "object", "required": keys, "properties": dict.fromkeys(
        keys, {"type": "string", "pattern": "^[a-z]{1,900}$"})}


def admits(grammar: str, text: str) -> bool:
    return bool(_is_grammar_accept_string(xgr.Grammar.from_ebnf(grammar), text))


def test_doctests() -> None:
    assert doctest.testmod(guided_json).failed == 0


@pytest.mark.parametrize("text, ok", [
    ('{"a": [1, 2], "b": "x"}', True),   # the style of the models' own JSON
    ('{"a":[1,2],"b":"x"}', False),      # compact: what the engine forced before
    ('{"a":  [1], "b": "x"}', False),    # no whitespace beyond the separators ...
    ('{"a": [1],\n"b": "x"}', False),
    ('{ "a": [1], "b": "x" }', False),   # ... so an answer cannot grow by whitespace
])
def test_a_schemas_grammar_has_the_models_separators_and_no_other_whitespace(
        text: str, ok: bool) -> None:
    assert admits(json_grammar(json.dumps(SCHEMA)), text) is ok


async def test_json_object_and_a_schema_become_grammars_other_constraints_stay() -> None:
    objects = (await as_grammar({"json_object": True}))["grammar"]
    assert admits(objects, '{"a": {"b": [1, "x", null]}}')
    assert not admits(objects, '{"a":{"b":1}}') and not admits(objects, "[1, 2]")
    assert await as_grammar({"json": SCHEMA}) == {"grammar": json_grammar(json.dumps(SCHEMA))}
    assert await as_grammar({"json": json.dumps(SCHEMA)}) == await as_grammar({"json": SCHEMA})
    assert await as_grammar({"regex": "[a-z]+"}) == {"regex": "[a-z]+"}


@pytest.mark.parametrize("schema, match", [
    ({"type": "integer", "minimum": "x"}, "Value must be a number"),  # xgrammar's refusal
    ({"type": "integer", "multipleOf": 2}, "not supported by xgrammar"),  # vLLM's
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     "not supported by xgrammar"),
])
async def test_a_schema_vllm_refused_is_refused_as_vllm_refused_it(
        schema: dict[str, object], match: str) -> None:
    """The runtime's caller turns these into SchemaError naming the parameter
    (``runtime.refusing_bad_schemas``; on an engine: tests/test_engine_tools.py)."""
    with pytest.raises(request_validation_errors(), match=match):
        await as_grammar({"json": schema})


async def test_a_slow_schema_converts_off_the_event_loop_and_once() -> None:
    """A schema within the limits whose conversion takes a second or more (long pattern
    counts, as scripts/guided_interference.py's "repeats"): the loop goes on meanwhile,
    and the same schema again is served from the cache. Names of its own: no earlier
    conversion in this process serves it."""
    schema = slow_schema()
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    start = time.perf_counter()
    first = await as_grammar({"json": schema})
    took = time.perf_counter() - start
    ticker.cancel()
    assert took > 0.2, "too fast to tell: make the schema slower"
    assert max(gaps) < took / 2, f"the loop stopped {max(gaps):.2f} s of {took:.2f} s"
    hits = json_grammar.cache_info().hits
    start = time.perf_counter()
    assert await as_grammar({"json": schema}) == first
    assert json_grammar.cache_info().hits == hits + 1
    assert time.perf_counter() - start < took / 10



async def test_the_same_schema_asked_at_once_converts_once() -> None:
    """Requests with one schema sent together (a client retrying, a fan-out) wait for one
    conversion: before, each converted it on a thread of its own, seconds of CPU each."""
    schema = slow_schema()
    misses = json_grammar.cache_info().misses
    grammars = await asyncio.gather(*(as_grammar({"json": schema}) for _ in range(4)))
    assert len({g["grammar"] for g in grammars}) == 1
    assert json_grammar.cache_info().misses == misses + 1


async def test_conversions_leave_the_default_executor_to_the_store() -> None:
    """Many slow guided requests at once: the loop's default executor, which the store's
    reads (a retrieval's vector search) run on, stays free; before, the conversions took
    its threads and a retrieval waited for them."""
    threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    conversions = [asyncio.ensure_future(as_grammar({"json": slow_schema()}))
                   for _ in range(threads + 2)]
    await asyncio.sleep(0.2)  # the conversions have started
    start = time.perf_counter()
    await asyncio.to_thread(lambda: None)  # what a store read waits for
    waited = time.perf_counter() - start
    done_before = sum(c.done() for c in conversions)
    await asyncio.gather(*conversions)
    assert waited < 1.0 and done_before < len(conversions), (waited, done_before)
