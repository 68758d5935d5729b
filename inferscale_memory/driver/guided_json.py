"""Guided JSON in the models' own style: a request's JSON schema turned into the grammar
vLLM guides it by.

vLLM turns a ``json`` or ``json_object`` request into xgrammar's grammar itself, with the
whitespace its engine-wide ``StructuredOutputsConfig.disable_any_whitespace`` says (vLLM
0.26 and 0.32 read no per-request setting): any whitespace anywhere, which a small model
can spend ``max_tokens`` on, or none at all (``{"a":[1,2]}``). Instruct models write
``", "`` and ``": "``, and a grammar that forbids those spaces pushes them off their own
distribution: guided by Mem0's schema, compact, Qwen2.5-Coder-1.5B-Instruct extracted an
empty list from a message it extracts well unguided (docs/adapters.md). So the runtime
converts each schema here, with xgrammar, into a grammar of exactly :data:`SEPARATORS` and
no other whitespace, and sends vLLM that grammar (``StructuredOutputsParams(grammar=)``).

The conversion is the work vLLM's front end did anyway to validate a ``json`` request
(``xgr.Grammar.from_json_schema``, seconds for an abusive schema within the limits of
:mod:`inferscale_memory.schema_limits`); vLLM now only parses the grammar's text. It runs
on one of :data:`CONVERTERS` threads of its own (xgrammar's C++ conversion releases the
GIL; not the event loop's default executor, which the store's reads use, so many guided
requests at once neither hold up other users' retrievals nor take every core), the same
schema asked again while it converts waits for that conversion, and the grammars of the
last :data:`CACHED_SCHEMAS` schemas are kept by the schema's JSON text. The checks vLLM's
xgrammar backend makes of a ``json`` schema first are made here too, so a schema it
refused is still refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

SEPARATORS = (", ", ": ")  # between items or properties, and between a key and its value
CACHED_SCHEMAS = 64
CONVERTERS = 2  # threads converting schemas, for every engine of the process
OBJECT_SCHEMA = '{"type": "object"}'  # json_object's, as vLLM's xgrammar backend writes it

_converters = ThreadPoolExecutor(CONVERTERS, thread_name_prefix="inferscale-grammar")
_converting: dict[str, Future[str]] = {}  # schema text -> its conversion under way
_converting_lock = threading.Lock()


async def as_grammar(structured_outputs: dict[str, Any]) -> dict[str, Any]:
    """``structured_outputs`` (keyword arguments of vLLM's ``StructuredOutputsParams``) with
    a ``json`` or ``json_object`` constraint replaced by its grammar (:func:`json_grammar`,
    on a thread); any other constraint as it is.

    Raises:
        ValueError: A schema that vLLM's xgrammar backend refuses or xgrammar cannot
            convert, where vLLM's own validation refused it before (vLLM 0.32's nesting
            check raises its ``VLLMValidationError``): one of
            :func:`~inferscale_memory.driver.frontend.request_validation_errors`.
    """
    rest = {k: v for k, v in structured_outputs.items() if k not in ("json", "json_object")}
    if structured_outputs.get("json_object"):
        schema_text = OBJECT_SCHEMA
    elif structured_outputs.get("json") is not None:
        schema = structured_outputs["json"]
        schema_text = schema if isinstance(schema, str) else json.dumps(schema,
                                                                        ensure_ascii=False)
    else:
        return structured_outputs
    # Shielded: a caller that gives up does not cancel what others may be waiting for.
    grammar = await asyncio.shield(asyncio.wrap_future(_conversion(schema_text)))
    return {**rest, "grammar": grammar}


def _conversion(schema_text: str) -> Future[str]:
    """:func:`json_grammar` of ``schema_text`` on a converter thread: the conversion under
    way for the same text, or a new one."""
    with _converting_lock:
        future = _converting.get(schema_text)
        if future is not None:
            return future
        future = _converters.submit(json_grammar, schema_text)
        _converting[schema_text] = future
    # Outside the lock: a conversion already done runs its callback here, which locks.
    future.add_done_callback(functools.partial(_converted, schema_text))
    return future


def _converted(schema_text: str, future: Future[str]) -> None:
    with _converting_lock:
        if _converting.get(schema_text) is future:
            del _converting[schema_text]


@functools.lru_cache(maxsize=CACHED_SCHEMAS)
def json_grammar(schema_text: str) -> str:
    """xgrammar's EBNF grammar of the JSON schema ``schema_text``: JSON with
    :data:`SEPARATORS` and no other whitespace. A schema that fails raises every time.

    Example:
        >>> grammar = json_grammar('{"type": "array", "items": {"type": "boolean"}}')
        >>> [rule for rule in grammar.splitlines() if rule.startswith("root_items")]
        ['root_items ::= ((", " basic_boolean))']

    Raises:
        ValueError: As :func:`as_grammar`.
    """
    import xgrammar as xgr

    schema = json.loads(schema_text)
    _check_like_vllm(schema)
    try:
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False,
                                               separators=SEPARATORS)
    except Exception as exc:  # xgrammar raises RuntimeError, naming the schema's fault
        raise ValueError(f"Failed to transform json schema into a grammar: {exc}") from exc
    return str(grammar)


def _check_like_vllm(schema: Any) -> None:
    """The checks vLLM's xgrammar backend makes of a ``json`` schema before converting it
    (``validate_xgrammar_grammar``): the features xgrammar would ignore, and in vLLM 0.32
    the nesting depth (``check_json_nesting``, which vLLM 0.26 may lack)."""
    from vllm import sampling_params
    from vllm.v1.structured_output.backend_xgrammar import (
        has_xgrammar_unsupported_json_features,
    )

    check_nesting = getattr(sampling_params, "check_json_nesting", None)
    if check_nesting is not None:
        check_nesting(schema)
    if isinstance(schema, dict) and has_xgrammar_unsupported_json_features(schema):
        raise ValueError("The provided JSON schema contains features not supported by "
                         "xgrammar.")
