"""Hostile input to the engine's Python API (``engine.memory`` and ``engine.chat``): every
call succeeds or raises a typed error, a refused call changes nothing, no call reaches
another user's facts, and the engine keeps serving.

A request option the engine core cannot decode (``seed="x"``, ``temperature=True``) used
to kill vLLM's input thread: every later request then hung. Calls run with a timeout so
that such a hang fails the test instead of the session.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from hostile import NASTY, NOT_STR, Draw, check_success, draw_call, file_state, listed
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferscale_memory.errors import (
    ContextLengthError,
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    UnknownUserError,
)
from inferscale_memory.store import Fact

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine

CALLERS = ["eh-alice", "eh-bob"]
VICTIM = "eh-victim"
USERS = [*CALLERS, VICTIM]
CALL_TIMEOUT_S = 120.0
MEMORY_CALLS = ["add", "add", "get", "list", "search", "update", "delete", "delete_all", "history"]
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.fixture(scope="module")
def forged(engine: MemoryEngine) -> list[str]:
    """Real fact ids of the callers and of the victim (whose facts must never change)."""
    ids = [
        f.id
        for f in engine.memory.add(
            ["Eve's bank PIN is 5093.", "Eve's diary is in the attic."], user_id=VICTIM
        )
    ]
    for user in CALLERS:
        ids.append(engine.memory.add(f"{user} likes green tea.", user_id=user).id)
    return ids


HUNG: list[str] = []  # the first call the engine never answered


def timed(engine: MemoryEngine, call: Callable[[], Any], what: str = "") -> Any:
    """Run a sync API call in a daemon thread (one the interpreter need not join at exit);
    a hang (a dead engine) fails the test, and every later call fails at once, naming
    the call that hung."""
    if HUNG:
        pytest.fail(f"the engine stopped answering after {HUNG[0]}")
    done: queue.Queue[tuple[bool, Any]] = queue.Queue()

    def target() -> None:
        try:
            done.put((True, call()))
        except BaseException as exc:  # handed to the test thread
            done.put((False, exc))

    threading.Thread(target=target, daemon=True).start()
    try:
        ok, value = done.get(timeout=CALL_TIMEOUT_S)
    except queue.Empty:
        HUNG.append(what or repr(call))
        pytest.fail(f"no answer in {CALL_TIMEOUT_S} s to {HUNG[0]}")
    if not ok:
        raise value
    return value


def assert_serves(engine: MemoryEngine) -> None:
    reply = timed(
        engine,
        lambda: engine.chat(
            [{"role": "user", "content": "What does eh-alice like?"}],
            user_id="eh-alice",
            k=3,
            max_tokens=4,
        ),
    )
    assert reply.metrics.output_tokens >= 1
    assert all(f.fact.user_id == "eh-alice" for f in reply.facts)


@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_hostile_memory_calls(engine: MemoryEngine, forged: list[str], data: st.DataObject) -> None:
    store = engine.store
    before = file_state(store, USERS)
    victim = listed(store, VICTIM)
    name, args, call, hostile = draw_call(
        data, engine.memory, store, CALLERS, forged, 600, MEMORY_CALLS
    )
    try:
        result = timed(engine, call, f"{name}{args!r:.300}")
    except InferScaleError as exc:
        event(f"{name}: {type(exc).__name__}")
        if hostile is None:
            # A well-formed text may still exceed max_fact_tokens (600 "y"s are 303
            # tokens): the documented size rule, refused like any other bad input.
            oversized = isinstance(exc, InvalidInputError) and "tokens; at most" in str(exc)
            assert oversized or isinstance(exc, FactNotFoundError | UnknownUserError), exc
        assert file_state(store, USERS) == before, f"a refused {name} changed the store"
        return
    except Exception as exc:  # noqa: BLE001 - the property under test
        pytest.fail(f"{name}{args!r:.300} raised {type(exc).__name__}: {exc!s:.300}")
    event(f"{name}: ok")
    assert listed(store, VICTIM) == victim, "another user's facts changed"
    check_success(store, name, args, result)


# -- chat ------------------------------------------------------------------------------

ASK = [{"role": "user", "content": "What does eh-alice like to drink?"}]
GOOD_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 3),
        "temperature": st.floats(0, 2),
        "stop": st.one_of(
            st.none(),
            st.text(min_size=1, max_size=5),
            st.lists(st.text(min_size=1, max_size=5), max_size=3),
        ),
        "seed": st.integers(-(2**63), 2**64 - 1),
        "logprobs": st.integers(0, 20),
        "ignore_eos": st.booleans(),
    },
)
BAD_OPTIONS = st.one_of(
    st.fixed_dictionaries(
        {"max_tokens": st.one_of(st.integers(max_value=0), NOT_STR, st.just(True), st.just(10**9))}
    ),
    st.fixed_dictionaries(
        {
            "temperature": st.one_of(
                st.sampled_from([True, False, "1", -0.5, 2.5, math.nan, math.inf, None]), NOT_STR
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "stop": st.one_of(
                st.sampled_from([5, [5], [""], "", ["ok", None], b"x", {"a": 1}, ["\ud800"]]),
                st.lists(st.just("s"), min_size=200, max_size=200),
            )
        }
    ),
    st.fixed_dictionaries(
        {"seed": st.one_of(st.sampled_from(["x", True, 1.5, 2**64, -(2**63) - 1, 10**30]), NOT_STR)}
    ),
    st.fixed_dictionaries(
        {"logprobs": st.one_of(st.sampled_from([-1, 21, 100, "5", True, 1.0]), NOT_STR)}
    ),
    st.fixed_dictionaries({"ignore_eos": st.sampled_from([1, 0, "yes", [True]])}),
    st.dictionaries(
        st.sampled_from(
            ["kv_transfer_params", "n", "best_of", "user_id2", "extra_args", "cache_salt"]
        ),
        st.none(),
        min_size=1,
    ),
)
GOOD_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant"]),
            "content": st.text(min_size=1, max_size=30),
        }
    ),
    max_size=3,
).map(lambda m: [*m, *ASK])
BAD_MESSAGES = st.one_of(
    NOT_STR,
    st.just([]),
    st.just("What?"),
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["robot", "user", None, 5, ["user"], {"a": 1}]),
                "content": st.one_of(st.sampled_from(NASTY), NOT_STR),
            }
        ),
        min_size=1,
        max_size=2,
    ),
    st.sampled_from(NASTY).map(lambda c: [{"role": "user", "content": c}]),
    st.just([{"role": "user", "content": "tell me more " * 3000}]),
    st.just([*ASK, {"role": "assistant", "content": "Tea."}]),
)


@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_hostile_chat_calls(engine: MemoryEngine, forged: list[str], data: st.DataObject) -> None:
    store = engine.store
    before = file_state(store, USERS)
    draw = Draw(
        data,
        {
            "user": (
                st.sampled_from(CALLERS),
                st.one_of(st.sampled_from(["eh-nobody", "", "\ud800", "u" * 129]), NOT_STR),
            ),
            "messages": (GOOD_MESSAGES, BAD_MESSAGES),
            "k": (st.integers(1, 8), st.one_of(st.sampled_from([0, -1, True, 2.5, "3", 10**30]))),
            "mode": (st.sampled_from(["kv", "text"]), st.one_of(st.text(max_size=5), NOT_STR)),
            "options": (GOOD_OPTIONS, BAD_OPTIONS),
        },
    )
    messages, user, k, mode = draw("messages"), draw("user"), draw("k"), draw("mode")
    options = {"max_tokens": 2, **draw("options")}
    what = (
        f"chat({messages!r:.200}, user_id={user!r:.50}, k={k!r}, mode={mode!r:.20}, "
        f"**{options!r:.200})"
    )
    try:
        reply = timed(
            engine, lambda: engine.chat(messages, user_id=user, k=k, mode=mode, **options), what
        )
    except InferScaleError as exc:
        event(f"chat ({draw.hostile}): {type(exc).__name__}")
        if draw.hostile is None:
            assert isinstance(exc, ContextLengthError), exc
    except Exception as exc:  # noqa: BLE001 - the property under test
        pytest.fail(f"{what} raised {type(exc).__name__}: {exc!s:.300}")
    else:
        event(f"chat ({draw.hostile}): ok")
        own = {f.id for f in listed(store, user)} if user is not None else set()
        assert all(f.fact.user_id == user for f in reply.facts)
        assert set(reply.metrics.fact_ids) <= own, "a fact of another user was used"
    assert file_state(store, USERS) == before, "a chat changed the store"


def test_engine_serves_after_hostile_calls(engine: MemoryEngine, forged: list[str]) -> None:
    assert_serves(engine)


# -- the cases that stopped the engine, and the size rules ------------------------------

ENGINE_KILLERS = [
    {"seed": "x"},
    {"temperature": True},
    {"seed": 1.5},
    {"seed": 10**30},
    {"stop": 5},
    {"stop": [""]},
    {"stop": [5]},
    {"logprobs": 100},
    {"logprobs": -1},
    {"logprobs": "5"},
    {"max_tokens": 0},
    {"max_tokens": True},
    {"temperature": "1"},
]


@pytest.mark.parametrize("options", ENGINE_KILLERS, ids=[repr(o) for o in ENGINE_KILLERS])
def test_bad_request_options_are_invalid_input(
    engine: MemoryEngine, forged: list[str], options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInputError):
        timed(engine, lambda: engine.chat(ASK, user_id="eh-alice", **options), repr(options))
    assert_serves(engine)


@pytest.mark.parametrize("text", [5, None, 3.5, "fact \ud800", ["fine fact", "\udfff"]])
def test_bad_fact_values_are_invalid_input(
    engine: MemoryEngine, forged: list[str], text: Any
) -> None:
    before = file_state(engine.store, USERS)
    with pytest.raises(InvalidInputError):
        timed(engine, lambda: engine.memory.add(text, user_id="eh-alice"))
    with pytest.raises(InvalidInputError):
        timed(engine, lambda: engine.memory.update(forged[2], text, user_id="eh-alice"))
    assert file_state(engine.store, USERS) == before


def test_forged_facts_in_answer_never_reach_another_user(
    engine: MemoryEngine, forged: list[str]
) -> None:
    """``answer`` takes Fact objects: a caller can forge one naming the victim's fact id
    under its own user id. The KV it may inject is keyed by (own user, id) and checked
    against the tokens, so it gets its own text's KV, never the victim's."""
    victim_fact = engine.store.get(forged[0], user_id=VICTIM)
    question = [{"role": "user", "content": "What is Eve's bank PIN?"}]
    for fake in (
        Fact(victim_fact.id, "eh-alice", "Eve's bank PIN is unknown.", {}, 0, 0),
        Fact("x" * 300, "eh-alice", "A fact with an overlong id.", {}, 0, 0),
        Fact("", "eh-alice", "A fact with an empty id.", {}, 0, 0),
    ):
        reply = timed(
            engine, lambda f=fake: engine.answer(question, [f], user_id="eh-alice", max_tokens=8)
        )
        assert "5093" not in reply.text
        assert reply.metrics.injected_tokens <= len(engine.builder.header_ids)
        timed(engine, lambda: engine.wait_for_background())
    with pytest.raises(InvalidInputError):
        engine.answer(question, [victim_fact], user_id="eh-alice")
    with pytest.raises(InvalidInputError):
        engine.answer(question, [Fact("f", "eh-alice", "bad \ud800", {}, 0, 0)], user_id="eh-alice")
    assert engine.store.get(victim_fact.id, user_id=VICTIM) == victim_fact
    assert_serves(engine)


def test_fact_size_rules(engine: MemoryEngine, forged: list[str]) -> None:
    """A fact may have at most ``config.max_fact_tokens`` tokens (256 by default) and
    ``max_fact_chars`` characters (4000, the store's); longer ones are refused."""
    limit = engine.config.max_fact_tokens
    count = engine.builder.fact_ids  # the tokens a fact takes in the prompt

    def sized(n_tokens: int) -> str:
        text = "tea"
        while len(count(text)) < n_tokens:
            text += " tea"
        assert len(count(text)) == n_tokens
        return text

    before = file_state(engine.store, USERS)
    for text in (sized(limit + 1), "z" * 4001, "z" * 2_000_000):
        with pytest.raises(InvalidInputError, match="at most"):
            timed(engine, lambda t=text: engine.memory.add(t, user_id="eh-alice"))
    assert file_state(engine.store, USERS) == before
    fact = timed(engine, lambda: engine.memory.add(sized(limit), user_id="eh-alice"))
    timed(engine, lambda: engine.memory.delete(fact.id, user_id="eh-alice"))
