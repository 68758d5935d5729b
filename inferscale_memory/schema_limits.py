"""How much a request may ask of guided decoding: bounds on its JSON schemas and tools.

A ``response_format`` schema or a tool's ``parameters`` is compiled by vLLM's grammar
compiler (xgrammar) in the engine core, the one process that serves every user: a schema
of 8,000 properties grew it from 0.6 to 8.2 GB, and the pattern ``^(a+)+$`` held it for
over two minutes while other users waited. :func:`check_guided` refuses such schemas
before they reach vLLM, in the engine (:func:`~inferscale_memory.tools.check_tool_request`,
which the server's requests go through too), with the limits of
``MemoryConfig.schema_limits``. It also refuses schemas that no answer can conform to:
a ``type`` that admits nothing (``[]``, or no JSON type) and a ``$ref`` to another
document (the grammar compiler fetches nothing); both were answered with unconstrained
JSON, as if it conformed.

A schema is measured as a whole (its compact JSON, its properties and ``$ref`` count) and per
subschema (its nesting, its ``enum``, its regexes); the tools of one request are measured
one by one and together, as ``tool_choice="required"`` compiles them into one grammar.

Example:
    >>> check_guided(SchemaLimits(), {"type": "string", "pattern": "^[a-z]+$"})
    >>> try:
    ...     check_guided(SchemaLimits(), {"type": "string", "pattern": "^(a+)+$"})
    ... except SchemaLimitError as exc:
    ...     print(exc.param, exc.limit)
    response_format.json_schema.schema pattern_star_height
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from inferscale_memory.errors import SchemaError

RESPONSE_PARAM = "response_format.json_schema.schema"
TOOLS_PARAM = "tools"
# Keywords whose value is a schema, a list of schemas, or a map of name -> schema. Only these
# are walked: ``enum``, ``const``, ``default`` and ``examples`` hold data.
ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "not", "if",
              "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
               "dependencies")
# A quantifier that may repeat its atom a varying number of times: *, +, {n,}, {n,m} (m > n).
_QUANTIFIER = re.compile(r"[*+?]|\{(\d+)(?:(,)(\d*))?\}")
_GROUP_OPEN = re.compile(r"\((?:\?(?:P?<[A-Za-z_][A-Za-z0-9_]*>|[A-Za-z-]*:))?")
_LOOKAROUNDS = ("(?=", "(?!", "(?<=", "(?<!")
_BACKREFERENCE = re.compile(r"\\(?:[1-9]|k<)")
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


@dataclass(frozen=True)
class SchemaLimits:
    """The bounds of :func:`check_guided`; ``MemoryConfig.schema_limits`` sets them by name.

    The defaults pass every schema of the project's tests, examples and adapters (the
    largest real one is a few KB) and refuse schemas that hold the grammar compiler for
    seconds (2,000 properties: ~1 s).
    """

    schema_bytes: int = 65_536  # one schema (or all tools' parameters), as compact UTF-8 JSON
    properties: int = 1_000  # names under "properties", all subschemas together
    enum_values: int = 1_000  # the longest "enum" list
    depth: int = 32  # subschemas nested in each other (the root is 1)
    refs: int = 100  # "$ref"s in one schema
    pattern_chars: int = 1_000  # the longest "pattern" or "patternProperties" regex
    pattern_star_height: int = 1  # repetitions nested in repetitions: "a+" 1, "(a+)+" 2
    tools: int = 128  # tools of one request


def merged_limits(overrides: Mapping[str, int]) -> dict[str, int]:
    """``overrides`` over the defaults of :class:`SchemaLimits` (the config's field).

    Raises:
        ValueError: A key that names no limit; the message lists the known ones.

    Example:
        >>> merged_limits({"properties": 5000})["properties"]
        5000
    """
    known = [f.name for f in fields(SchemaLimits)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown schema_limits keys {unknown}; known keys: {known}")
    return {**asdict(SchemaLimits()), **overrides}


class SchemaLimitError(SchemaError):
    """A schema or the tools of a request go past a :class:`SchemaLimits` bound.

    Attributes:
        param: The request parameter at fault (``"tools.0.function.parameters"``, ...).
        limit: The ``schema_limits`` key that bounds it, or ``None`` for a regex feature
            the grammar cannot express.
    """

    def __init__(self, message: str, param: str, limit: str | None) -> None:
        super().__init__(message, param)
        self.limit = limit


class Subschema(NamedTuple):
    """One schema within a schema: its JSON-pointer-like path, nesting depth and body."""

    where: str
    depth: int
    node: dict[str, Any]


class SchemaSize(NamedTuple):
    """What a schema adds to its request's totals."""

    bytes: int
    properties: int
    refs: int


def check_guided(limits: SchemaLimits, response_schema: dict[str, Any] | None = None,
                 tool_parameters: Sequence[dict[str, Any] | None] = ()) -> None:
    """Refuse a request whose ``response_format`` schema or tools (their ``parameters``)
    ask more of guided decoding than ``limits``.

    Raises:
        SchemaLimitError: The message names the parameter, the limit, its value and the
            ``schema_limits`` key that raises it.
    """
    if len(tool_parameters) > limits.tools:
        raise _over(TOOLS_PARAM, f"{len(tool_parameters)} tools", limits, "tools")
    if response_schema is not None:
        check_schema(response_schema, limits, RESPONSE_PARAM)
    sizes = [check_schema(p, limits, f"tools.{i}.function.parameters")
             for i, p in enumerate(tool_parameters) if p is not None]
    totals = (("schema_bytes", sum(s.bytes for s in sizes)),
              ("properties", sum(s.properties for s in sizes)),
              ("refs", sum(s.refs for s in sizes)))
    for key, value in totals:
        if value > getattr(limits, key):
            raise _over(TOOLS_PARAM, f"all tools' parameters together have {value} {key}",
                        limits, key)


def check_schema(schema: dict[str, Any], limits: SchemaLimits, param: str) -> SchemaSize:
    """Refuse one schema past ``limits`` or admitting no value; its size otherwise.

    Raises:
        SchemaLimitError: Past ``limits``, naming ``param``.
        SchemaError: An empty or unknown ``type``, or a ``$ref`` outside the schema.
    """
    size = _json_bytes(schema, limits, param)
    if size > limits.schema_bytes:
        raise _over(param, f"the schema is {size} bytes of JSON", limits, "schema_bytes")
    properties = refs = 0
    for where, depth, node in subschemas(schema):
        where = where or "the root"
        if depth > limits.depth:
            raise _over(param, f"subschemas are nested {depth} deep (at {where[:200]})",
                        limits, "depth")
        problem = _admits_nothing(node)
        if problem is not None:
            raise SchemaError(f"{param}: {problem} (at {where})", param)
        properties += len(node["properties"]) if isinstance(node.get("properties"), dict) else 0
        refs += "$ref" in node
        enum = node.get("enum")
        if isinstance(enum, list) and len(enum) > limits.enum_values:
            raise _over(param, f"an enum of {len(enum)} values (at {where[:200]})", limits,
                        "enum_values")
        for pattern in _patterns(node):
            _check_pattern(pattern, limits, param, where)
    if properties > limits.properties:
        raise _over(param, f"the schema has {properties} properties", limits, "properties")
    if refs > limits.refs:
        raise _over(param, f"the schema has {refs} $refs", limits, "refs")
    return SchemaSize(size, properties, refs)


def subschemas(schema: dict[str, Any]) -> Iterator[Subschema]:
    """Every schema within ``schema`` (itself included, at depth 1); iterative, so a
    deeply nested schema cannot exhaust the stack.

    Example:
        >>> [s.where for s in subschemas({"items": {"properties": {"a": {}}}})]
        ['', '/items', '/items/properties/a']
    """
    stack: list[tuple[str, int, Any]] = [("", 1, schema)]
    while stack:
        where, depth, node = stack.pop()
        if not isinstance(node, dict):
            continue  # true/false schemas; a malformed one is vLLM's to refuse
        yield Subschema(where, depth, node)
        for key in ONE_SCHEMA:
            if isinstance(node.get(key), dict):
                stack.append((f"{where}/{key}", depth + 1, node[key]))
        for key in SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((f"{where}/{key}/{i}", depth + 1, item)
                             for i, item in enumerate(node[key]))
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((f"{where}/{key}/{name}", depth + 1, item)
                             for name, item in node[key].items())


def star_height(pattern: str) -> int:
    r"""How deeply repetitions nest in ``pattern``: a group repeated a varying number of
    times (``*``, ``+``, ``{n,}``, ``{n,m}``) adds one to the repetitions inside it, and
    a repeated group whose alternatives overlap (one starts another) counts as a
    repetition inside. Fixed counts (``{3}``) and ``?`` add nothing.

    Example:
        >>> [star_height(p) for p in ("^abc$", "^[a-z]+$", "^(\\d{1,3}\\.){3}$",
        ...                           "^(a+)+$", "^(a*)*$", "^(a|a)*$", "^((ab)+c)+$")]
        [0, 1, 1, 2, 2, 2, 2]
    """
    return _RegexScan(pattern).star_height()


def unsupported_feature(pattern: str) -> str | None:
    r"""A regex feature of ``pattern`` that a grammar cannot express (backreferences,
    lookarounds), or ``None``.

    Example:
        >>> [unsupported_feature(p) for p in ("^(a)\\1$", "^a(?=b)", "^a$")]
        ['a backreference', 'a lookaround', None]
    """
    if _BACKREFERENCE.search(pattern.replace("\\\\", "")):
        return "a backreference"
    if any(look in pattern for look in _LOOKAROUNDS):
        return "a lookaround"
    return None


# -- internals ---------------------------------------------------------------------------

def _over(param: str, what: str, limits: SchemaLimits, key: str,
          fix: str = "simplify the schema") -> SchemaLimitError:
    return SchemaLimitError(
        f"{param}: {what}, over the limit of {getattr(limits, key)} (schema_limits.{key}); "
        f"{fix}, or raise the limit (MemoryConfig(schema_limits={{{key!r}: ...}}), "
        "INFERSCALE_SCHEMA_LIMITS)", param, key)


def _json_bytes(schema: dict[str, Any], limits: SchemaLimits, param: str) -> int:
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise _over(param, "the schema is nested deeper than Python can encode", limits,
                    "depth") from None
    except (TypeError, ValueError) as exc:
        raise SchemaLimitError(f"{param}: the schema is not JSON ({exc})", param,
                               None) from None
    return len(text.encode("utf-8", "surrogatepass"))


def _admits_nothing(node: dict[str, Any]) -> str | None:
    """Why no value can conform to ``node`` (its own keywords only), or ``None``."""
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not types:
            return "type [] admits no value"
        unknown = [t for t in types if not isinstance(t, str) or t not in JSON_TYPES]
        if unknown:
            return f"type {unknown[0]!r} is not a JSON type (one of {sorted(JSON_TYPES)})"
    ref = node.get("$ref")
    if "$ref" in node and not (isinstance(ref, str) and ref.startswith("#")):
        return (f"$ref {ref!r} points outside the schema; only references within it "
                "(\"#/$defs/...\") are supported")
    return None


def _patterns(node: dict[str, Any]) -> Iterator[str]:
    if isinstance(node.get("pattern"), str):
        yield node["pattern"]
    if isinstance(node.get("patternProperties"), dict):
        yield from (key for key in node["patternProperties"] if isinstance(key, str))


def _check_pattern(pattern: str, limits: SchemaLimits, param: str, where: str) -> None:
    shown = f"pattern {pattern[:80]!r} (at {where[:200]})"
    if len(pattern) > limits.pattern_chars:
        raise _over(param, f"{shown} is {len(pattern)} characters", limits, "pattern_chars")
    feature = unsupported_feature(pattern)
    if feature is not None:
        raise SchemaLimitError(
            f"{param}: {shown} uses {feature}, which guided decoding cannot express; "
            "write the pattern without it", param, None)
    height = star_height(pattern)
    if height > limits.pattern_star_height:
        raise _over(param, f"{shown} nests repetitions {height} deep (a repeated group that "
                    "repeats inside, like (a+)+ or (a|a)*)", limits, "pattern_star_height",
                    "write the pattern without the nesting")


class _Group:
    """A group being read: where its text starts, its top-level ``|``s, its height."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.bars: list[int] = []
        self.height = 0


class _RegexScan:
    """One left-to-right read of a regex that tracks only groups, alternatives and
    quantifiers (escapes and character classes are single atoms)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.groups = [_Group(0)]
        self.atom_height: int | None = None  # the last atom's height (None: no atom)
        self.atom_overlaps = False  # the last atom is a group of overlapping alternatives

    def star_height(self) -> int:
        i, text = 0, self.pattern
        while i < len(text):
            quantifier = _QUANTIFIER.match(text, i)
            if text[i] == "\\":
                i = self._atom(i + 2)
            elif text[i] == "[":
                i = self._atom(_class_end(text, i))
            elif text[i] == "(":
                opened = _GROUP_OPEN.match(text, i)
                i = opened.end() if opened else i + 1
                self.groups.append(_Group(i))
            elif text[i] == ")" and len(self.groups) > 1:
                i = self._close(i)
            elif text[i] == "|":
                self.groups[-1].bars.append(i)
                self.atom_height, i = None, i + 1
            elif quantifier is not None and self.atom_height is not None:
                i = self._quantify(quantifier)
            else:
                i = self._atom(i + 1)
        while len(self.groups) > 1:  # unclosed: vLLM refuses the regex itself
            self._close(len(text))
        return self.groups[0].height

    def _atom(self, end: int) -> int:
        self.atom_height, self.atom_overlaps = 0, False
        return end

    def _close(self, i: int) -> int:
        group = self.groups.pop()
        edges = [group.start - 1, *group.bars, i]
        branches = [self.pattern[a + 1:b] for a, b in zip(edges, edges[1:], strict=False)]
        self.atom_height = group.height
        self.atom_overlaps = len(branches) > 1 and any(
            b.startswith(a) for j, a in enumerate(branches) for k, b in enumerate(branches)
            if j != k)
        self.groups[-1].height = max(self.groups[-1].height, group.height)
        return i + 1

    def _quantify(self, quantifier: re.Match[str]) -> int:
        low, comma, high = quantifier.groups()
        repeats = quantifier.group() in ("*", "+") or (
            comma is not None and (not high or int(high) > max(int(low), 1)))
        assert self.atom_height is not None
        inner = max(self.atom_height, 1) if self.atom_overlaps else self.atom_height
        height = inner + 1 if repeats else self.atom_height
        self.groups[-1].height = max(self.groups[-1].height, height)
        self.atom_height = None  # a quantifier after a quantifier is lazy/possessive
        end = quantifier.end()
        return end + 1 if end < len(self.pattern) and self.pattern[end] in "?+" else end


def _class_end(text: str, i: int) -> int:
    """The index after the character class that opens at ``text[i]``."""
    i += 2 if text.startswith("[^", i) else 1
    if i < len(text) and text[i] == "]":
        i += 1  # a leading "]" is a literal
    while i < len(text) and text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i + 1
