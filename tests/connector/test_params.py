"""The per-request protocol: what parse_params accepts, what it refuses, and the salt."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_memory.connector.params import (
    MAX_NAME_CHARS,
    MAX_SPANS,
    PARAMS_KEY,
    SHARED_NS,
    FactKey,
    ParamsError,
    RequestParams,
    Span,
    cache_salt,
    pack_spans,
    parse_params,
    token_digest,
)

HEADER = "header:3f2a"
PROMPT_LEN = 40


def body(**fields: Any) -> dict[str, Any]:
    """A request's ``kv_transfer_params`` with our body, user alice by default."""
    return {PARAMS_KEY: {"user": "alice", "layout": "L1", **fields}}


def test_valid_body_is_parsed_into_sorted_spans_and_keys() -> None:
    raw = body(
        capture=[["alice", "f2", 20, 30], ["", HEADER, 0, 10], ["alice", "f1", 10, 20]],
        inject=[["", HEADER, 0, 10], ["alice", "f1", 10, 20]],
        evict=[["alice", "old"], ["", "header:0000"]],
    )
    params = parse_params(raw, PROMPT_LEN)
    assert params == RequestParams(
        user="alice",
        layout="L1",
        capture=(Span(FactKey(SHARED_NS, HEADER), 0, 10),
                 Span(FactKey("alice", "f1"), 10, 20),
                 Span(FactKey("alice", "f2"), 20, 30)),
        inject=(Span(FactKey(SHARED_NS, HEADER), 0, 10),
                Span(FactKey("alice", "f1"), 10, 20)),
        evict=(FactKey("alice", "old"), FactKey(SHARED_NS, "header:0000")),
    )
    assert params.capture[1].length == 10


def test_span_may_end_at_the_prompt_end_and_adjacent_spans_do_not_overlap() -> None:
    params = parse_params(body(capture=[["alice", "a", 0, 20], ["alice", "b", 20, PROMPT_LEN]]),
                          PROMPT_LEN)
    assert params is not None
    assert [s.end for s in params.capture] == [20, PROMPT_LEN]


def test_minimal_body_and_layout_default() -> None:
    params = parse_params({PARAMS_KEY: {"user": "bob"}}, 5)
    assert params == RequestParams("bob", "")


@pytest.mark.parametrize("raw", [None, {}, {"do_remote_prefill": True}])
def test_no_params_of_ours_gives_none(raw: dict[str, Any] | None) -> None:
    assert parse_params(raw, PROMPT_LEN) is None


@pytest.mark.parametrize("field", ["capture", "inject"])
def test_other_users_span_is_refused(field: str) -> None:
    with pytest.raises(ParamsError, match="own user"):
        parse_params(body(**{field: [["bob", "f1", 0, 5]]}), PROMPT_LEN)


def test_other_users_eviction_is_refused() -> None:
    with pytest.raises(ParamsError, match="own user"):
        parse_params(body(evict=[["bob", "f1"]]), PROMPT_LEN)


@pytest.mark.parametrize("field", ["capture", "inject"])
@pytest.mark.parametrize("name", ["f1", "headers", "Header:x", "xheader:1"])
def test_shared_namespace_holds_only_headers(field: str, name: str) -> None:
    with pytest.raises(ParamsError, match="shared namespace"):
        parse_params(body(**{field: [["", name, 0, 5]]}), PROMPT_LEN)
    with pytest.raises(ParamsError, match="shared namespace"):
        parse_params(body(evict=[["", name]]), PROMPT_LEN)


@pytest.mark.parametrize("field", ["capture", "inject"])
@pytest.mark.parametrize("start,end", [(-1, 5), (0, PROMPT_LEN + 1), (5, 5), (6, 5),
                                       (PROMPT_LEN, PROMPT_LEN + 1)])
def test_span_outside_the_prompt_is_refused(field: str, start: int, end: int) -> None:
    with pytest.raises(ParamsError, match="outside the prompt"):
        parse_params(body(**{field: [["alice", "f", start, end]]}), PROMPT_LEN)


@pytest.mark.parametrize("field", ["capture", "inject"])
@pytest.mark.parametrize("second", [(9, 15), (0, 10), (2, 3), (0, 40)])
def test_overlapping_spans_are_refused(field: str, second: tuple[int, int]) -> None:
    spans = [["alice", "a", 0, 10], ["alice", "b", *second]]
    with pytest.raises(ParamsError, match="overlap"):
        parse_params(body(**{field: spans}), PROMPT_LEN)
    # in either order
    with pytest.raises(ParamsError, match="overlap"):
        parse_params(body(**{field: spans[::-1]}), PROMPT_LEN)


@pytest.mark.parametrize("field", ["capture", "inject"])
@pytest.mark.parametrize("bounds", [(True, 5), (0, True), (False, 1), (0.0, 5), (0, 5.0),
                                    ("0", 5), (None, 5), (0, [5])])
def test_non_integer_bounds_are_refused(field: str, bounds: tuple[Any, Any]) -> None:
    with pytest.raises(ParamsError, match="integers"):
        parse_params(body(**{field: [["alice", "f", *bounds]]}), PROMPT_LEN)


@pytest.mark.parametrize("field", ["capture", "inject", "evict"])
def test_oversize_lists_are_refused(field: str) -> None:
    if field == "evict":
        items: list[Any] = [["alice", f"f{i}"] for i in range(MAX_SPANS + 1)]
        ok: list[Any] = items[:MAX_SPANS]
        prompt_len = 1
    else:
        items = [["alice", f"f{i}", i, i + 1] for i in range(MAX_SPANS + 1)]
        ok = items[:MAX_SPANS]
        prompt_len = MAX_SPANS + 1
    with pytest.raises(ParamsError, match="at most"):
        parse_params(body(**{field: items}), prompt_len)
    params = parse_params(body(**{field: ok}), prompt_len)
    assert params is not None and len(getattr(params, field)) == MAX_SPANS


@pytest.mark.parametrize("inner", [[], "alice", 3, None, ["user", "alice"], True])
def test_non_object_body_is_refused(inner: Any) -> None:
    with pytest.raises(ParamsError, match="must be an object"):
        parse_params({PARAMS_KEY: inner}, PROMPT_LEN)


@pytest.mark.parametrize("fields", [
    {},                               # no user
    {"user": ""},
    {"user": 3},
    {"user": ["alice"]},
    {"user": "alice", "layout": 1},
    {"user": "alice", "layout": None},
])
def test_bad_user_or_layout_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ParamsError, match="user"):
        parse_params({PARAMS_KEY: fields}, PROMPT_LEN)


@pytest.mark.parametrize("field,value", [
    ("capture", {"a": 1}),
    ("capture", "alice"),
    ("inject", None),
    ("evict", ("alice", "f")),
    ("capture", [["alice", "f", 0]]),
    ("capture", [["alice", "f", 0, 5, 6]]),
    ("inject", [("alice", "f", 0, 5)]),
    ("inject", [[None, "f", 0, 5]]),
    ("inject", [["alice", 7, 0, 5]]),
    ("inject", [["alice", "", 0, 5]]),
    ("inject", [["alice", "x" * (MAX_NAME_CHARS + 1), 0, 5]]),
    ("evict", [["alice"]]),
    ("evict", ["alice"]),
    ("evict", [[1, 2]]),
])
def test_malformed_fields_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ParamsError):
        parse_params(body(**{field: value}), PROMPT_LEN)


def test_longest_allowed_name_is_accepted() -> None:
    name = "x" * MAX_NAME_CHARS
    params = parse_params(body(inject=[["alice", name, 0, 5]]), PROMPT_LEN)
    assert params is not None and params.inject[0].key.name == name


def test_to_dict_round_trips_through_parse_params() -> None:
    original = RequestParams(
        user="alice",
        layout="L9",
        capture=(Span(FactKey("", HEADER), 0, 7), Span(FactKey("alice", "f"), 7, 19)),
        inject=(Span(FactKey("", HEADER), 0, 7),),
        evict=(FactKey("alice", "g"),),
    )
    assert parse_params(original.to_dict(), 19) == original
    bare = RequestParams("alice", "L9")
    assert bare.to_dict() == {PARAMS_KEY: {"user": "alice", "layout": "L9"}}
    assert parse_params(bare.to_dict(), 1) == bare


user_names = st.text(min_size=1, max_size=6)
fact_names = st.text(min_size=1, max_size=8)


@st.composite
def request_params(draw: st.DrawFn) -> tuple[RequestParams, int]:
    user = draw(user_names)
    layout = draw(st.text(max_size=6))

    def key(shared: bool) -> FactKey:
        if shared:
            return FactKey(SHARED_NS, "header:" + draw(st.text(max_size=5)))
        return FactKey(user, draw(fact_names))

    def spans(unique: bool) -> tuple[Span, ...]:
        lengths = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), max_size=5))
        out: list[Span] = []
        position = 0
        for gap, length in lengths:
            position += gap
            # a shared header can only start the prompt
            span_key = key(position == 0 and draw(st.booleans()))
            if unique and span_key in {s.key for s in out}:
                continue
            out.append(Span(span_key, position, position + length))
            position += length
        return tuple(out)

    capture, inject = spans(unique=True), spans(unique=False)
    evict = tuple(key(draw(st.booleans())) for _ in range(draw(st.integers(0, 3))))
    ends = [s.end for s in capture + inject]
    prompt_len = max(ends, default=0) + draw(st.integers(0, 3))
    return RequestParams(user, layout, capture, inject, evict), prompt_len


@settings(max_examples=200, deadline=None)
@given(request_params())
def test_to_dict_round_trips_for_random_params(case: tuple[RequestParams, int]) -> None:
    params, prompt_len = case
    assert parse_params(params.to_dict(), prompt_len) == params


def test_cache_salt_differs_per_user_and_per_layout() -> None:
    salts = {cache_salt(t, layout) for t in ("alice", "bob") for layout in ("L1", "L2")}
    assert len(salts) == 4
    assert cache_salt("alice", "L1") == cache_salt("alice", "L1")
    # no ambiguity from concatenating the two parts
    assert cache_salt("ab", "c") != cache_salt("a", "bc")
    assert cache_salt("alice", "L1").startswith("inferscale-")


def test_token_digest_depends_on_order_and_content() -> None:
    assert token_digest([1, 2, 3]) == token_digest((1, 2, 3))
    assert token_digest([1, 2, 3]) != token_digest([3, 2, 1])
    assert token_digest([12, 3]) != token_digest([1, 23])


json_scalars = (st.none() | st.booleans() | st.integers(-3, 50) | st.floats(allow_nan=True)
                | st.text(max_size=8) | st.sampled_from(["", "alice", "bob", HEADER, "header:"]))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
)
near_items = st.lists(
    st.sampled_from(["alice", "bob", "", HEADER, "f"]) | st.integers(-2, 45) | json_scalars,
    min_size=0, max_size=5,
)
near_field = st.lists(near_items | json_values, max_size=6) | json_values
near_bodies = st.fixed_dictionaries(
    {},
    optional={
        "user": st.sampled_from(["alice", "bob", ""]) | json_values,
        "layout": st.text(max_size=4) | json_values,
        "capture": near_field,
        "inject": near_field,
        "evict": near_field,
    },
) | json_values


@settings(max_examples=300, deadline=None)
@given(raw=st.dictionaries(st.sampled_from([PARAMS_KEY, "other"]), near_bodies, max_size=2),
       prompt_len=st.integers(0, 45))
def test_junk_bodies_raise_only_params_error(raw: dict[str, Any], prompt_len: int) -> None:
    try:
        params = parse_params(raw, prompt_len)
    except ParamsError:
        return
    if PARAMS_KEY not in raw:
        assert params is None
        return
    # Whatever was accepted is well formed and round-trips.
    assert params is not None
    for span in params.capture + params.inject:
        assert 0 <= span.start < span.end <= prompt_len
        assert span.key.ns in (params.user, SHARED_NS)
        assert span.key.ns != SHARED_NS or span.start == 0
    assert parse_params(params.to_dict(), prompt_len) == params


@pytest.mark.parametrize("field", ["capture", "inject"])
def test_shared_header_must_start_the_prompt(field: str) -> None:
    # A header's KV is shared by every user and must depend on its tokens only: one
    # captured after other tokens would carry that user's context into everyone's
    # prompts (the registry only checks the tokens).
    with pytest.raises(ParamsError, match="position 0"):
        parse_params(body(**{field: [["", HEADER, 5, 13]]}), PROMPT_LEN)
    params = parse_params(body(**{field: [["", HEADER, 0, 8]]}), PROMPT_LEN)
    assert params is not None


def test_capture_names_each_key_once() -> None:
    # The worker collects a step's captures per (request, key): two spans of one key
    # would store the KV of one under the position of the other.
    with pytest.raises(ParamsError, match="more than once"):
        parse_params(body(capture=[["alice", "f", 8, 12], ["alice", "f", 20, 24]]), PROMPT_LEN)
    # injecting one fact twice is fine: each load piece is copied on its own
    params = parse_params(body(inject=[["alice", "f", 8, 12], ["alice", "f", 12, 16]]),
                          PROMPT_LEN)
    assert params is not None and len(params.inject) == 2


# -- the packed wire form ---------------------------------------------------------------


def list_form(spans: tuple[Span, ...]) -> list[list[Any]]:
    """The documented ``[ns, name, start, end]`` form of ``spans``."""
    return [[s.key.ns, s.key.name, s.start, s.end] for s in spans]


def test_to_dict_packs_spans_into_three_objects_whatever_their_number() -> None:
    # vLLM checks, deep-copies and encodes every item of extra_args: a k-fact request
    # must not cross to the engine core as 5k Python objects.
    spans = tuple(Span(FactKey("alice", f"f{i}"), i, i + 1) for i in range(100))
    inject = RequestParams("alice", "L", inject=spans).to_dict()[PARAMS_KEY]["inject"]
    assert set(inject) == {"ns", "names", "spans"} and inject["ns"] == ["alice"]
    assert isinstance(inject["names"], str) and isinstance(inject["spans"], bytes)
    assert parse_params(body(inject=inject), 100) == parse_params(
        body(inject=list_form(spans)), 100)


span_items = st.lists(st.tuples(
    st.sampled_from(["alice", "", "bob"]),
    st.sampled_from(["f", "g", HEADER, "header:", "", "x" * MAX_NAME_CHARS,
                     "x" * (MAX_NAME_CHARS + 1), "é\u2063"]),
    st.integers(-3, PROMPT_LEN + 3), st.integers(-3, PROMPT_LEN + 3)), max_size=6)


@settings(max_examples=400, deadline=None)
@given(items=span_items, field=st.sampled_from(["capture", "inject"]))
def test_packed_and_list_forms_pass_the_same_checks(
        items: list[tuple[str, str, int, int]], field: str) -> None:
    # Forged spans (another user's, a header after position 0, out of the prompt,
    # overlapping, a capture naming a key twice) are refused whichever form names them.
    spans = tuple(Span(FactKey(ns, name), start, end) for ns, name, start, end in items)
    outcomes = []
    for value in (list_form(spans), pack_spans(spans)):
        try:
            outcomes.append(parse_params(body(**{field: value}), PROMPT_LEN))
        except ParamsError:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]


packed_junk = st.fixed_dictionaries(
    {"ns": st.lists(st.sampled_from(["alice", "", "bob"]), max_size=3) | json_values,
     "names": st.text(max_size=12) | json_values,
     "spans": st.binary(max_size=100) | st.lists(st.integers(-2, 45), max_size=8).map(
         lambda v: array("q", v).tobytes()) | json_values},
    optional={"extra": json_values})


@settings(max_examples=300, deadline=None)
@given(packed=packed_junk, field=st.sampled_from(["capture", "inject"]),
       prompt_len=st.integers(0, 45))
def test_junk_packed_spans_raise_only_params_error(packed: dict[str, Any], field: str,
                                                   prompt_len: int) -> None:
    try:
        params = parse_params(body(**{field: packed}), prompt_len)
    except ParamsError:
        return
    assert params is not None
    for span in getattr(params, field):
        assert 0 <= span.start < span.end <= prompt_len
        assert span.key.ns in ("alice", SHARED_NS)
        assert 1 <= len(span.key.name) <= MAX_NAME_CHARS
        assert span.key.ns != SHARED_NS or (span.start == 0
                                            and span.key.name.startswith("header:"))
    assert parse_params(params.to_dict(), prompt_len) == params


def test_packed_spans_survive_vllms_transport_to_the_engine_core() -> None:
    pytest.importorskip("vllm")
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    params = RequestParams("alice", "L", capture=(Span(FactKey("alice", "c"), 30, 40),),
                           inject=(Span(FactKey("", HEADER), 0, 10),
                                   Span(FactKey("alice", "é"), 10, 30)))
    sampling = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params.to_dict()})
    request = EngineCoreRequest("r", list(range(PROMPT_LEN)), None, sampling, None, 0.0,
                                None, None, None)
    decoded = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(request))
    raw = decoded.sampling_params.extra_args["kv_transfer_params"]
    assert parse_params(raw, PROMPT_LEN) == params


def test_a_span_hashed_in_its_packed_prompt_has_the_digest_of_its_ids() -> None:
    # The scheduler packs a prompt once and hashes each span's slice: the digest must be
    # the one registered from the fact's own ids, or every load would be refused.
    prompt = [7, 2**40, 0, 3, 128_000, 5]
    packed = memoryview(array("q", prompt))
    for start, end in ((0, 6), (1, 3), (5, 6)):
        assert token_digest(packed[start:end]) == token_digest(prompt[start:end])
