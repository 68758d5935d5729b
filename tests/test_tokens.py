"""The token-level API: requests in the library's layout that the connector accepts."""

from __future__ import annotations

import doctest

import pytest

import inferscale_memory.tokens
from inferscale_memory.connector.params import parse_params
from inferscale_memory.errors import InvalidInputError
from inferscale_memory.tokens import TokenFacts

HEADER = [1, 2, 3, 4]


def test_the_docstring_example_runs() -> None:
    assert doctest.testmod(inferscale_memory.tokens).failed == 0


def test_a_capture_keeps_the_header_and_the_fact_where_they_are() -> None:
    request = TokenFacts("alice", HEADER, layout="mine").capture("f0", [9, 8, 7])
    assert request.token_ids == HEADER + [9, 8, 7]
    params = request.params
    # as the connector reads it
    assert parse_params(params.to_dict(), len(request.token_ids)) == params
    assert params.user == "alice" and params.layout == "mine" and not params.inject
    header, fact = params.capture
    assert (header.key.ns, header.start, header.end) == ("", 0, 4)
    assert (fact.key.ns, fact.key.name) == ("alice", "f0")
    assert request.token_ids[fact.start:fact.end] == [9, 8, 7]


def test_a_capture_after_context_facts_keeps_only_the_header_and_the_fact() -> None:
    request = TokenFacts("alice", HEADER).capture("f0", [9, 8], context=[[5, 5], [6]])
    assert request.token_ids == HEADER + [5, 5, 6, 9, 8]
    params = request.params
    assert parse_params(params.to_dict(), len(request.token_ids)) == params
    header, fact = params.capture  # the context's KV is not kept
    assert (header.start, header.end) == (0, 4)
    assert (fact.key.name, fact.start, fact.end) == ("f0", 7, 9)


def test_a_prompt_names_the_header_and_the_first_facts_for_injection() -> None:
    facts = TokenFacts("alice", HEADER)
    request = facts.prompt([("a", [5, 5]), ("b", [6, 6, 6]), ("c", [7])], [0, 0], inject=2)
    assert request.token_ids == HEADER + [5, 5, 6, 6, 6, 7, 0, 0]
    assert parse_params(request.params.to_dict(), len(request.token_ids)) == request.params
    spans = request.params.inject
    assert [s.key.name for s in spans] == ["header:tokens", "a", "b"]  # c is computed
    assert [request.token_ids[s.start:s.end] for s in spans[1:]] == [[5, 5], [6, 6, 6]]
    assert request.injected_tokens == 4 + 2 + 3
    assert facts.prompt([("a", [5, 5])], []).injected_tokens == 6  # default: every fact
    assert facts.prompt([("a", [5, 5])], [1], inject=0).injected_tokens == 4  # header only


@pytest.mark.parametrize("call", [
    lambda f: f.capture("", [1]),
    lambda f: f.capture("f", []),
    lambda f: f.capture("f", [1, -2]),
    lambda f: f.capture("f", [1, True]),
    lambda f: f.capture("f", [1], context=[[]]),
    lambda f: f.capture("f", [1], context=[[2, -1]]),
    lambda f: f.prompt([("a", [1])], [2], inject=2),
    lambda f: f.prompt([("a", [1])], [2], inject=-1),
    lambda f: f.prompt([("a", [1])], ["x"]),
])
def test_bad_input_is_refused_with_a_typed_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInputError):
        call(TokenFacts("alice", HEADER))


def test_a_user_id_and_a_header_are_required() -> None:
    with pytest.raises(InvalidInputError):
        TokenFacts("", HEADER)
    with pytest.raises(InvalidInputError):
        TokenFacts("alice", [])


@pytest.mark.parametrize("bad", [[1, -2], [1, True], [False], [1, 2.0], [1, "3"], [None],
                                 [3, 2, 1, -1]])
@pytest.mark.parametrize("where", ["fact", "question", "header"])
def test_every_token_id_is_checked(bad: list[object], where: str) -> None:
    # Ids are checked a fact at a time, in C where they are plain ints >= 0: an id of
    # another type or a negative one anywhere is still refused.
    ok = [1, 2]
    with pytest.raises(InvalidInputError, match="token ids"):
        facts = TokenFacts("alice", bad if where == "header" else HEADER)
        facts.prompt([("a", ok), ("b", bad if where == "fact" else ok)],
                     bad if where == "question" else ok)


def test_int_subclasses_other_than_bool_are_token_ids() -> None:
    from enum import IntEnum

    class Token(IntEnum):
        A = 5

    request = TokenFacts("alice", HEADER).prompt([("a", [Token.A, 6])], [Token.A])
    assert request.token_ids == HEADER + [5, 6, 5]


def test_an_empty_fact_among_others_is_refused() -> None:
    facts = TokenFacts("alice", HEADER)
    with pytest.raises(InvalidInputError, match="non-empty"):
        facts.prompt([("a", [1, 2]), ("b", []), ("c", [3, 4, 5])], [6])  # 5 ids, 3 facts
    assert facts.prompt([("a", (1, 2)), ("b", range(3, 5))], iter([6])).token_ids == (
        HEADER + [1, 2, 3, 4, 6])  # any sequence of ids, any iterable question
