"""Bounds on what a request may ask of guided decoding (issue 30, item 2): the limits
without an engine, the config's ``schema_limits``, and one refusal by the shared engine.

The refusals over HTTP (400, naming the parameter): tests/server/test_server_robustness.py.
"""

from __future__ import annotations

import doctest
from typing import TYPE_CHECKING, Any, Literal

import pytest
from pydantic import BaseModel, Field

import inferscale_memory.schema_limits
from inferscale_memory import InvalidInputError, MemoryConfig, SchemaError
from inferscale_memory.options import check_chat
from inferscale_memory.schema_limits import (
    SchemaLimitError,
    SchemaLimits,
    check_guided,
    star_height,
)
from inferscale_memory.tools import check_tool_request
from mem0_inferscale.extraction import EXTRACTION_FORMAT, EXTRACTION_SCHEMA

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine

NESTED = {"type": "string", "pattern": "^(a+)+$"}  # held the engine core > 120 s
WIDE = {"type": "object", "required": [f"field_{i:04d}" for i in range(8000)],
        "properties": {f"field_{i:04d}": {"type": "string"} for i in range(8000)}}  # 231 KB


class Address(BaseModel):
    street: str
    city: str
    postcode: str = Field(pattern=r"^[0-9]{5}(-[0-9]{4})?$")


class Person(BaseModel):
    """What LangChain's and LlamaIndex's structured output hand over: a model's schema."""

    name: str = Field(min_length=1, max_length=100)
    age: int | None = Field(None, ge=0, le=150)
    role: Literal["user", "assistant", "admin"]
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
    addresses: list[Address] = []
    tags: dict[str, str] = {}


WEATHER = {"type": "function", "function": {"name": "weather"}}


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def refusal(schema: dict[str, Any], limits: SchemaLimits | None = None) -> SchemaLimitError:
    with pytest.raises(SchemaLimitError) as caught:
        check_guided(limits or SchemaLimits(), schema)
    return caught.value


def test_doctests() -> None:
    assert doctest.testmod(inferscale_memory.schema_limits).failed == 0


@pytest.mark.parametrize("schema", [
    EXTRACTION_SCHEMA,
    Person.model_json_schema(),
    {"type": "object", "properties": {"ip": {"type": "string",
                                             "pattern": r"^(\d{1,3}\.){3}\d{1,3}$"}}},
    {"type": "string", "pattern": r"^\(?\d{3}\)?[-. ]?\d{3}-\d{4}$"},
    {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "string"}}},
], ids=["mem0", "pydantic", "ipv4", "phone", "patternProperties"])
def test_real_schemas_pass(schema: dict[str, Any]) -> None:
    check_guided(SchemaLimits(), schema)
    check_tool_request(response_format=json_schema(schema))
    check_tool_request(tools=[tool("f", schema)], tool_choice="required")


def test_the_mem0_adapters_format_passes() -> None:
    assert check_tool_request(response_format=EXTRACTION_FORMAT) is not None


# Schemas no answer can conform to: guided decoding answered them with unconstrained JSON.
ADMIT_NOTHING: list[dict[str, Any]] = [
    {"type": []},
    {"type": "text"},
    {"type": ["string", 3]},
    {"properties": {"a": {"items": [{"$ref": "other.json#/a"}]}}},
    {"anyOf": [{"$ref": "https://example.com/s.json"}]},
    {"$defs": {"a": {"$ref": 7}}},
]


@pytest.mark.parametrize("schema", [
    # properties named like keywords, and data that looks like a schema
    {"type": "object", "properties": {"type": {"type": "string"}, "$ref": {"type": "string"}}},
    {"enum": [{"$ref": "https://example.com"}, {"type": []}], "default": {"type": []}},
    {"$defs": {"n": {"type": ["integer", "null"]}}, "items": {"$ref": "#/$defs/n"}},
    {"anyOf": [True, {"type": "string"}], "not": False},
], ids=["keyword-names", "data", "local-ref", "booleans"])
def test_schemas_that_admit_values_pass(schema: dict[str, Any]) -> None:
    check_guided(SchemaLimits(), schema)


@pytest.mark.parametrize("schema", ADMIT_NOTHING, ids=[str(i) for i in range(len(ADMIT_NOTHING))])
def test_empty_types_and_outside_refs_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaError) as caught:
        check_tool_request(tools=[WEATHER, tool("f", schema)])
    assert caught.value.param == "tools.1.function.parameters"
    assert not isinstance(caught.value, SchemaLimitError)  # over HTTP: 400 invalid_schema


@pytest.mark.parametrize("pattern", ["^(a+)+$", "^(a*)*$", "^(a|a)*$", "^(a|ab)+$",
                                     "^((ab)+c)+$", "^(a{2,3})+$"])
def test_nested_quantifiers_are_refused(pattern: str) -> None:
    error = refusal({"type": "string", "pattern": pattern})
    assert error.limit == "pattern_star_height" and star_height(pattern) == 2
    assert error.param == "response_format.json_schema.schema"
    assert "over the limit of 1 (schema_limits.pattern_star_height)" in str(error)


def test_patterns_guided_decoding_cannot_express_are_refused() -> None:
    for pattern, feature in [(r"^(a)\1$", "backreference"), (r"^(?<x>a)\k<x>$", "backreference"),
                             ("^a(?=b)", "lookaround"), ("^(?<!b)a", "lookaround")]:
        error = refusal({"type": "object", "properties": {"a": {"type": "string",
                                                                "pattern": pattern}}})
        assert error.limit is None and feature in str(error) and "/properties/a" in str(error)
    error = refusal({"type": "object", "patternProperties": {"^(a+)+$": {}}})
    assert error.limit == "pattern_star_height"
    assert refusal({"type": "string", "pattern": "a" * 1001}).limit == "pattern_chars"


def test_the_wide_schema_is_refused_by_size_and_by_properties() -> None:
    error = refusal(WIDE)
    assert error.limit == "schema_bytes" and "over the limit of 65536" in str(error)
    # Under the byte limit, still too many properties for the grammar compiler.
    small = {"type": "object", "properties": {f"p{i}": {} for i in range(1001)}}
    error = refusal(small)
    assert error.limit == "properties" and "1001 properties" in str(error)


def test_huge_enums_deep_nesting_and_many_refs_are_refused() -> None:
    assert refusal({"enum": list(range(1001))}).limit == "enum_values"
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(32):
        deep = {"type": "array", "items": deep}
    error = refusal(deep)
    assert error.limit == "depth" and "nested 33 deep" in str(error)
    for _ in range(100_000):  # deeper than json.dumps can go: still a typed refusal
        deep = {"type": "array", "items": deep}
    assert refusal(deep).limit == "depth"
    refs = {"$defs": {"s": {"type": "string"}},
            "properties": {f"p{i}": {"$ref": "#/$defs/s"} for i in range(101)}}
    assert refusal(refs).limit == "refs"


def test_tools_are_bounded_one_by_one_and_together() -> None:
    many = [tool(f"t{i}", {}) for i in range(129)]
    with pytest.raises(SchemaLimitError, match=r"129 tools.*schema_limits\.tools") as caught:
        check_tool_request(tools=many)
    assert caught.value.param == "tools"
    with pytest.raises(SchemaLimitError) as caught:
        check_tool_request(tools=[tool("a", {}), tool("b", NESTED)], tool_choice="required")
    assert caught.value.param == "tools.1.function.parameters"
    # Each under the byte limit, together over it: "required" compiles them as one grammar.
    third = {"type": "object", "description": "x" * 30_000}
    with pytest.raises(SchemaLimitError, match="all tools' parameters together") as caught:
        check_tool_request(tools=[tool(f"t{i}", third) for i in range(3)])
    assert caught.value.param == "tools" and caught.value.limit == "schema_bytes"


def test_limits_come_from_the_config_merged_over_the_defaults() -> None:
    config = MemoryConfig(schema_limits={"pattern_star_height": 2, "enum_values": 5})
    assert config.schema_limits == {**vars(SchemaLimits()), "pattern_star_height": 2,
                                    "enum_values": 5}
    ask = [{"role": "user", "content": "Hi"}]

    def chat(config: MemoryConfig, schema: dict[str, Any]) -> Any:
        return check_chat(config, ask, k=None, mode="kv", memory=True, fact_order=None,
                          recompute_tail=None, tool_parser="hermes", model_name="m",
                          response_format=json_schema(schema))

    assert chat(config, NESTED).tooling is not None  # raised: passes
    with pytest.raises(InvalidInputError, match=r"schema_limits\.pattern_star_height"):
        chat(MemoryConfig(), NESTED)
    with pytest.raises(InvalidInputError, match=r"enum of 6 values .*over the limit of 5 "):
        chat(config, {"enum": list(range(6))})


@pytest.mark.engine
def test_the_engine_refuses_the_nested_pattern_before_vllm(
        engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_vllm(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the request reached vLLM")

    monkeypatch.setattr(engine.runtime, "stream", no_vllm)
    with pytest.raises(InvalidInputError, match=r"schema_limits\.pattern_star_height"):
        engine.chat([{"role": "user", "content": "Say a"}], max_tokens=48,
                    response_format=json_schema(NESTED))
