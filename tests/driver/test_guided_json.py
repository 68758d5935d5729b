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
import threading
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
    """A schema with names of its own (no earlier conversion in this process serves it);
    with 20 names its conversion takes about a second here."""
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


class Gate:
    """xgrammar's schema conversion (the third-party edge), held until the test opens the
    gate: which threads convert, how many at once, and whether the event loop ran on while
    they were held. A conversion left waiting 30 s gives up (the test then fails on
    ``held_too_long``) instead of hanging the suite."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.threads: list[str] = []
        self.held_too_long = 0
        self._lock = threading.Lock()
        convert = xgr.Grammar.from_json_schema

        def held(*args: object, **kwargs: object) -> object:
            with self._lock:
                self.threads.append(threading.current_thread().name)
            if not self.open.wait(30):
                self.held_too_long += 1
            return convert(*args, **kwargs)

        monkeypatch.setattr(xgr.Grammar, "from_json_schema", staticmethod(held))

    async def entered(self, count: int) -> None:
        """Until ``count`` conversions have started (the loop stays free meanwhile)."""
        for _ in range(3000):
            if len(self.threads) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.threads)} of {count} conversions started")


async def test_a_schema_converts_off_the_event_loop_and_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The conversion runs on a converter thread: the loop opens the gate while the
    conversion waits behind it, which a conversion on the loop's own thread would never
    let it do. The same schema again is served from the cache, with no second conversion.
    Names of its own: no earlier conversion in this process serves it."""
    gate = Gate(monkeypatch)
    schema = slow_schema(2)
    first = asyncio.ensure_future(as_grammar({"json": schema}))
    await gate.entered(1)
    assert not first.done()
    gate.open.set()  # the loop ran while the conversion was held
    grammar = await first
    assert gate.held_too_long == 0
    assert len(gate.threads) == 1 and gate.threads[0].startswith("inferscale-grammar")
    hits = json_grammar.cache_info().hits
    assert await as_grammar({"json": schema}) == grammar
    assert json_grammar.cache_info().hits == hits + 1
    assert len(gate.threads) == 1  # not converted again


async def test_the_same_schema_asked_at_once_converts_once() -> None:
    """Requests with one schema sent together (a client retrying, a fan-out) wait for one
    conversion: before, each converted it on a thread of its own, seconds of CPU each."""
    schema = slow_schema()
    misses = json_grammar.cache_info().misses
    grammars = await asyncio.gather(*(as_grammar({"json": schema}) for _ in range(4)))
    assert len({g["grammar"] for g in grammars}) == 1
    assert json_grammar.cache_info().misses == misses + 1


async def test_conversions_leave_the_default_executor_to_the_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Many guided requests at once, every conversion held: the loop's default executor,
    which the store's reads (a retrieval's vector search) run on, still answers, and no
    more conversions run at once than there are converter threads; before, the
    conversions took the default executor's threads and a retrieval waited for them."""
    gate = Gate(monkeypatch)
    threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    conversions = [asyncio.ensure_future(as_grammar({"json": slow_schema(2)}))
                   for _ in range(threads + 2)]
    await gate.entered(guided_json.CONVERTERS)
    # What a store read waits for. The bound only keeps a regression from hanging.
    reader = await asyncio.wait_for(
        asyncio.to_thread(lambda: threading.current_thread().name), 30)
    assert not reader.startswith("inferscale-grammar")
    assert len(gate.threads) == guided_json.CONVERTERS
    assert not any(c.done() for c in conversions)
    gate.open.set()
    await asyncio.gather(*conversions)
    assert gate.held_too_long == 0
    assert len(gate.threads) == len(conversions)
    assert {name.rsplit("_", 1)[0] for name in gate.threads} == {"inferscale-grammar"}
