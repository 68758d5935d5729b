"""The server's schema and tool-result checks without an engine: they read a schema's own
keywords only (the refusals themselves, over HTTP: test_server_robustness.py)."""

from __future__ import annotations

from typing import Any

import pytest

from inferscale_memory.server.errors import APIError
from inferscale_memory.server.request_checks import check_schema

FINE: list[dict[str, Any]] = [
    # properties named like keywords, and data that looks like a schema
    {"type": "object", "properties": {"type": {"type": "string"}, "$ref": {"type": "string"}}},
    {"enum": [{"$ref": "https://example.com"}, {"type": []}], "default": {"type": []}},
    {"$defs": {"n": {"type": ["integer", "null"]}}, "items": {"$ref": "#/$defs/n"}},
    {"anyOf": [True, {"type": "string"}], "not": False},
]
REFUSED: list[dict[str, Any]] = [
    {"type": []},
    {"type": "text"},
    {"type": ["string", 3]},
    {"properties": {"a": {"items": [{"$ref": "other.json#/a"}]}}},
    {"anyOf": [{"$ref": "https://example.com/s.json"}]},
    {"$defs": {"a": {"$ref": 7}}},
]


@pytest.mark.parametrize("schema", FINE, ids=[str(i) for i in range(len(FINE))])
def test_schemas_that_admit_values_pass(schema: dict[str, Any]) -> None:
    check_schema(schema, "p")


@pytest.mark.parametrize("schema", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_empty_types_and_outside_refs_are_400(schema: dict[str, Any]) -> None:
    with pytest.raises(APIError) as caught:
        check_schema(schema, "p")
    assert caught.value.status == 400 and caught.value.param == "p"


def test_a_deep_schema_does_not_exhaust_the_stack() -> None:
    schema: dict[str, Any] = {"type": []}
    for _ in range(100_000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(APIError):
        check_schema(schema, "p")
