"""The checks of chat options (no engine): every value vLLM's engine core cannot take is
refused with InvalidInputError before a request is sent (tests/test_engine_hostile.py
sends them to the real engine)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferscale_memory.conversation import Conversation
from inferscale_memory.errors import InvalidInputError
from inferscale_memory.fields import SEED_MAX, SEED_MIN
from inferscale_memory.options import check_options


def check(**options: Any) -> dict[str, Any]:
    return check_options(options, default_max_tokens=16, max_logprobs=20)


def test_defaults_and_normalised_values() -> None:
    assert check() == {"max_tokens": 16, "temperature": 0.0}
    assert check(max_tokens=None, temperature=None, seed=None) == check()
    out = check(max_tokens=3, temperature=1, stop="END", seed=SEED_MIN, logprobs=0)
    assert out == {
        "max_tokens": 3,
        "temperature": 1.0,
        "stop": ["END"],
        "seed": SEED_MIN,
        "logprobs": 0,
    }
    assert isinstance(out["temperature"], float)
    assert check(stop=("a", "b"), seed=SEED_MAX, logprobs=20)["stop"] == ["a", "b"]


def test_sampling_options() -> None:
    out = check(top_p=0.9, top_k=40, presence_penalty=-1, frequency_penalty=0.5)
    assert out == {"max_tokens": 16, "temperature": 0.0, "top_p": 0.9, "top_k": 40,
                   "presence_penalty": -1.0, "frequency_penalty": 0.5}
    assert all(type(out[key]) is float for key in ("top_p", "presence_penalty"))
    assert check(top_p=1, top_k=0)["top_k"] == 0  # 0: every token, as vLLM


BAD = [
    {"max_tokens": 0},
    {"max_tokens": -1},
    {"max_tokens": True},
    {"max_tokens": 2.0},
    {"max_tokens": "8"},
    {"temperature": True},
    {"temperature": "1"},
    {"temperature": -0.1},
    {"temperature": 2.5},
    {"temperature": math.nan},
    {"temperature": math.inf},
    {"stop": 5},
    {"stop": [5]},
    {"stop": [""]},
    {"stop": ""},
    {"stop": ["\ud800"]},
    {"stop": ["x"] * 17},
    {"stop": ["y" * 257]},
    {"stop": {"a": 1}},
    {"stop": b"x"},
    {"seed": "x"},
    {"seed": True},
    {"seed": 1.5},
    {"seed": SEED_MAX + 1},
    {"seed": SEED_MIN - 1},
    {"logprobs": -1},
    {"logprobs": 21},
    {"logprobs": "5"},
    {"logprobs": True},
    {"ignore_eos": 1},
    {"ignore_eos": "yes"},
    {"kv_transfer_params": {}},
    {"n": 2},
    {"top_p": 0},
    {"top_p": 1.5},
    {"top_p": "0.9"},
    {"top_p": math.nan},
    {"top_k": -2},
    {"top_k": 4.0},
    {"top_k": True},
    {"presence_penalty": 2.5},
    {"frequency_penalty": -3},
    {"frequency_penalty": "1"},
    {"logit_bias": {}},
]


@pytest.mark.parametrize("options", BAD, ids=[repr(o)[:40] for o in BAD])
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        check(**options)


@settings(max_examples=300, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # a loaded machine is no bug
@given(
    st.dictionaries(
        st.sampled_from(["max_tokens", "temperature", "stop", "seed", "logprobs", "ignore_eos",
                         "top_p", "top_k", "presence_penalty", "frequency_penalty"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(),
            st.lists(st.one_of(st.text(), st.integers())),
        ),
    )
)
def test_accepted_options_have_the_types_vllm_decodes(options: dict[str, Any]) -> None:
    try:
        out = check(**options)
    except InvalidInputError:
        return
    assert type(out["max_tokens"]) is int and out["max_tokens"] >= 1
    assert type(out["temperature"]) is float and 0 <= out["temperature"] <= 2
    assert all(type(s) is str and s for s in out.get("stop", []))
    assert type(out.get("seed", 0)) is int and SEED_MIN <= out.get("seed", 0) <= SEED_MAX
    assert type(out.get("logprobs", 0)) is int and 0 <= out.get("logprobs", 0) <= 20
    assert type(out.get("ignore_eos", False)) is bool
    assert type(out.get("top_p", 1.0)) is float and 0 < out.get("top_p", 1.0) <= 1
    assert type(out.get("top_k", 0)) is int and out.get("top_k", 0) >= 0
    for key in ("presence_penalty", "frequency_penalty"):
        assert type(out.get(key, 0.0)) is float and -2 <= out.get(key, 0.0) <= 2


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": ["user"], "content": "hi"}],
        [{"role": {"a": 1}, "content": "hi"}],
        [{"role": "user", "content": "hi \ud800"}],
        [{"role": "user", "content": None}],
    ],
)
def test_bad_messages_are_refused(messages: Any) -> None:
    with pytest.raises(InvalidInputError):
        Conversation.check(messages)


def test_openai_message_shapes_become_plain_messages() -> None:
    """The message shapes the server's OpenAPI document shows are the engine's own."""
    checked = Conversation.check([
        {"role": "developer", "content": [{"type": "text", "text": "Be "},
                                          {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Hi", "name": "omar"}])
    assert list(checked) == [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}]


def test_max_completion_tokens_is_openais_max_tokens() -> None:
    assert check(max_completion_tokens=5)["max_tokens"] == 5
    assert check(max_completion_tokens=5, max_tokens=3)["max_tokens"] == 5
    with pytest.raises(InvalidInputError) as refused:
        check(max_completion_tokens=0)
    assert refused.value.param == "max_completion_tokens"


@pytest.mark.parametrize(("options", "param"), [
    ({"temperature": "hot"}, "temperature"), ({"stop": ["ok", "\ud800"]}, "stop.1"),
    ({"seed": SEED_MAX + 1}, "seed"), ({"logprobs": 21}, "logprobs"), ({"n": 2}, "n")])
def test_a_refused_option_names_its_param(options: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        check(**options)
    assert refused.value.param == param


# -- a whole chat call (check_chat), against an engine's config, still without an engine --

QUESTION = [{"role": "user", "content": "What does Omar grow?"}]
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def chat(config: Any = None, parser: str | None = "hermes", **kwargs: Any) -> Any:
    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.options import check_chat

    config = config or MemoryConfig.load(k=7, max_tokens=12, fact_order="time",
                                         recompute_tail=3)
    call = {"k": None, "mode": "kv", "memory": True, "fact_order": None,
            "recompute_tail": None, **kwargs}
    return check_chat(config, QUESTION if "messages" not in kwargs else call.pop("messages"),
                      tool_parser=parser, model_name="tiny", **call)


def test_a_chat_call_takes_the_configs_values_for_what_it_leaves_out() -> None:
    request = chat()
    assert (request.k, request.max_tokens, request.fact_order, request.recompute_tail) == (
        7, 12, "time", 3)
    assert list(request.conversation) == QUESTION and request.tooling is None
    assert request.sampling == {"temperature": 0.0}  # max_tokens is taken out
    given = chat(k=2, fact_order="rank", recompute_tail=0, max_tokens=5, seed=3)
    assert (given.k, given.max_tokens, given.fact_order, given.recompute_tail) == (
        2, 5, "rank", 0)
    assert given.sampling == {"temperature": 0.0, "seed": 3}


@pytest.mark.parametrize("bad", [
    {"k": 0}, {"k": "3"}, {"mode": "fast"}, {"memory": "off"}, {"memory": 1},
    {"fact_order": "alphabetical"}, {"recompute_tail": -1}, {"temperature": "hot"},
    {"messages": [{"role": "assistant", "content": "Hi"}]},  # the last one must be the user's
    {"messages": []}, {"tools": [{"type": "function"}]},
])
def test_a_bad_chat_call_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        chat(**bad)


def test_tools_need_a_tool_parser_and_constrain_decoding() -> None:
    with pytest.raises(InvalidInputError, match="tool_parser is None.*tiny|tiny.*tool_parser"):
        chat(parser=None, tools=[WEATHER])
    request = chat(tools=[WEATHER], tool_choice="required")
    assert request.tooling is not None and request.tooling.calls_tools
    assert request.sampling["structured_outputs"] is not None  # decoding follows the tools
    assert request.sampling["skip_special_tokens"] is True
    auto = chat(tools=[WEATHER])  # "auto": the model's own call markup is kept, unparsed
    assert auto.sampling["skip_special_tokens"] is False
