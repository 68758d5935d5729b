"""LangChain's standard unit tests for ChatInferScale (no engine, no network)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_inferscale import ChatInferScale
from langchain_inferscale.chat_models import _from_config, _to_openai


def get_weather(city: str) -> str:
    """The weather in a city now."""
    return "sunny"


class TestChatInferScaleUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatInferScale]:
        return ChatInferScale

    @property
    def chat_model_params(self) -> dict:
        return {"user_id": "caroline", "k": 4}

    @property
    def has_tool_calling(self) -> bool:
        return True  # on a model whose template has tools (tests/integration_tests)

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine serves one model


def test_messages_become_openai_dicts() -> None:
    messages = [SystemMessage("be brief"), HumanMessage("hi"), AIMessage("hello"),
                HumanMessage([{"type": "text", "text": "where"}])]
    assert _to_openai(messages) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "where"}]


def test_tool_calls_and_results_become_openai_dicts() -> None:
    call = {"name": "get_weather", "args": {"city": "Berlin"}, "id": "call_1"}
    messages = [AIMessage("", tool_calls=[call]), ToolMessage("sunny", tool_call_id="call_1")]
    assert _to_openai(messages) == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]


@pytest.mark.parametrize(("choice", "expected"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"), ("any", "required"),
    (False, "none"), (True, {"type": "function", "function": {"name": "get_weather"}}),
    ("get_weather", {"type": "function", "function": {"name": "get_weather"}}),
])
def test_tool_choice_takes_langchains_forms(choice: object, expected: object) -> None:
    bound = ChatInferScale().bind_tools([get_weather], tool_choice=choice)
    assert bound.kwargs["tool_choice"] == expected  # type: ignore[attr-defined]
    assert bound.kwargs["tools"][0]["function"]["name"] == "get_weather"  # type: ignore[attr-defined]


def test_a_tool_choice_naming_no_bound_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="names no bound tool"):
        ChatInferScale().bind_tools([get_weather], tool_choice="get_time")
    with pytest.raises(ValueError, match="exactly one tool"):
        ChatInferScale().bind_tools([get_weather, get_weather], tool_choice=True)


def test_structured_output_refuses_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="method"):
        ChatInferScale().with_structured_output(get_weather, method="xml")  # type: ignore[arg-type]


def test_configurable_memory_options_reach_the_call() -> None:
    config = {"configurable": {"user_id": "bob", "k": 3, "thread_id": "t"}}
    assert _from_config(config, {}) == {"user_id": "bob", "k": 3}
    assert _from_config(config, {"user_id": "ann"})["user_id"] == "ann"


def test_ls_params_name_the_provider() -> None:
    params = ChatInferScale(max_tokens=8, stop=["x"])._get_ls_params()
    assert params["ls_provider"] == "inferscale"
    assert params["ls_max_tokens"] == 8 and params["ls_stop"] == ["x"]


def test_without_an_engine_the_default_engine_is_announced(
        caplog: pytest.LogCaptureFixture) -> None:
    from inferscale_memory import ModelPreparationError

    # A model folder that does not exist: the default engine fails fast after the warning.
    llm = ChatInferScale(model="./no-such-model-folder")
    with caplog.at_level("WARNING"), pytest.raises(ModelPreparationError):
        llm.invoke("Hi")
    assert any("no engine given" in r.getMessage() and "engine=MemoryEngine" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("key", ["userid", "userId", "user-id", "user", "usr_id", "Mode"])
def test_a_misspelled_configurable_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="configurable"):
        _from_config({"configurable": {key: "bob", "thread_id": "t"}}, {})


def test_other_configurable_keys_pass() -> None:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "__pregel_x": 1,
                               "model": "m", "session_id": "s"}}
    assert _from_config(config, {}) == {}


def test_facts_already_in_the_prompt_are_found_by_their_text() -> None:
    from inferscale_memory import Fact, ScoredFact
    from langchain_inferscale.injection import split_pasted

    def scored(fact_id: str, text: str) -> ScoredFact:
        return ScoredFact(Fact(fact_id, "u", text, {}, 0.0, 0.0), 1.0)

    facts = [scored("a", "Nora lives in Lisbon."), scored("b", "Nora has a cat.")]
    messages = [{"role": "system", "content": "Facts:\n- Nora lives\n  in Lisbon."},
                {"role": "user", "content": "Where does Nora live?"}]
    kept, skipped = split_pasted(facts, messages)
    assert [f.fact.id for f in kept] == ["b"] and skipped == ["a"]
    assert split_pasted(facts, messages[1:]) == (facts, [])
