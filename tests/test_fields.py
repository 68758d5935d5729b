"""The shared field types (no engine): the config, the engine's per-call checks, the chat
options and the server's request schemas take each rule from one place, so they accept and
refuse the same values (the server's chat fields only show it: the engine checks them)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import TypeAdapter

from inferscale_memory import ConfigError, InvalidInputError, MemoryConfig
from inferscale_memory.conversation import Conversation
from inferscale_memory.fields import (
    FACT_ORDERS,
    FactCount,
    FactOrder,
    RecomputeTail,
    Temperature,
    UnicodeText,
    check,
    unicode_text,
)
from inferscale_memory.options import ChatOptions, check_options
from inferscale_memory.server.schemas import ChatCompletionRequest, MemoryOptions

QUALITY = [
    ("fact_order", FactOrder, "time", ["random", 1, None, "RANK"]),
    ("recompute_tail", RecomputeTail, 2, [-1, 1.5, True]),
    ("k", FactCount, 3, [0, -2, True, 2.5]),
]


@pytest.mark.parametrize(("name", "kind", "good", "bad"), QUALITY, ids=[q[0] for q in QUALITY])
def test_config_engine_and_server_share_a_rule(name: str, kind: Any, good: Any,
                                               bad: list[Any]) -> None:
    """The config and the engine check a memory option by one rule; the server's request
    schema shows that rule (with its own upper bound) and passes the value on as sent, for
    the engine to check (issue 32: once)."""
    assert getattr(MemoryConfig.from_dict({name: good}), name) == good
    assert check(kind, good, name) == good
    assert getattr(MemoryOptions(**{name: good}), name) == good
    documented = MemoryOptions.model_json_schema()["properties"][name]["anyOf"][0]
    shown = TypeAdapter(kind).json_schema()
    assert {key: documented[key] for key in shown} == shown
    for value in bad:
        with pytest.raises(ConfigError, match=name):
            MemoryConfig.from_dict({name: value})
        with pytest.raises(InvalidInputError, match=name):
            check(kind, value, name)
        assert getattr(MemoryOptions(**{name: value}), name) == value


def test_fact_orders_are_the_literal() -> None:
    assert FACT_ORDERS == ("rank", "time")
    for order in FACT_ORDERS:
        assert MemoryConfig.from_dict({"fact_order": order}).fact_order == order


SAMPLING = [
    ("temperature", 0.7, [-0.1, 2.5, math.nan, math.inf, True, "1"]),
    ("top_p", 1, [0, 1.5, math.nan, "0.9"]),
    ("top_k", 40, [-2, 4.0, True]),
    ("presence_penalty", -1.5, [2.5, -3, "1"]),
    ("seed", 2**64 - 1, [2**64, -(2**63) - 1, 1.5, "x"]),
    ("stop", ["END"], ["", [""], [5], ["y" * 257], ["x"] * 17, ["\ud800"]]),
]


@pytest.mark.parametrize(("name", "good", "bad"), SAMPLING, ids=[s[0] for s in SAMPLING])
def test_the_server_schema_shows_the_engines_rule_and_leaves_the_check_to_it(
        name: str, good: Any, bad: list[Any]) -> None:
    """The engine checks a sampling option (issue 32: once); the server's request schema
    documents the same type for the OpenAPI document and passes the value on as sent."""
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    kind = ChatOptions.model_fields[name].annotation
    documented = ChatCompletionRequest.model_json_schema()["properties"][name]
    assert documented["anyOf"] == TypeAdapter(kind).json_schema()["anyOf"]
    assert check_options({name: good}, default_max_tokens=8)[name] == good
    for value in bad:
        with pytest.raises(InvalidInputError, match=name) as refused:
            check_options({name: value}, default_max_tokens=8)
        assert refused.value.param is not None and refused.value.param.startswith(name)
        sent = ChatCompletionRequest(**request, **{name: value})
        assert sent.engine_options() == {name: value}


def test_one_unicode_check_names_the_place() -> None:
    assert unicode_text("Zoë 🐈", "x") == "Zoë 🐈"
    with pytest.raises(InvalidInputError, match=r"the query holds a lone surrogate .* 3"):
        unicode_text("abc\udc80", "the query")
    with pytest.raises(InvalidInputError, match="message 0: content holds a lone surrogate"):
        Conversation.check([{"role": "user", "content": "\ud800"}])
    with pytest.raises(InvalidInputError, match=r"stop\.1: the text holds a lone surrogate"):
        check_options({"stop": ["ok", "\ud800"]}, default_max_tokens=8)


def test_check_is_strict_and_names_the_value() -> None:
    assert check(Temperature, 1, "temperature") == 1.0
    with pytest.raises(InvalidInputError, match=r"^k: .*greater than or equal to 1; got 0$"):
        check(FactCount, 0, "k")
    with pytest.raises(InvalidInputError, match=r"fact_order: .*got 'fast'"):
        check(FactOrder, "fast", "fact_order")
    with pytest.raises(InvalidInputError, match="^a fact's text: .*valid string; got 5$"):
        check(UnicodeText, 5, "a fact's text")
