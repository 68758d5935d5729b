"""LangChain's standard integration tests for ChatInferScale on the real engine."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

pytestmark = pytest.mark.engine
USER = "lc-standard"
# What SmolLM2-135M-Instruct itself gets wrong in these tests (its answers under guided
# decoding, not our parsing; the same calls on Qwen2.5's template: test_tools.py). Marked
# xfail(run=False), as the suite's own check requires of an overridden test, and not run:
# run, they cost engine time and, as non-strict xfails, could not fail.
WRONG_ARGUMENT = ("SmolLM2-135M, forced to call magic_function for 'magic_function(3)', "
                  "writes another integer as its input (e.g. 100)")
NO_CALL_ON_ITS_OWN = "SmolLM2-135M does not call a tool on its own (tool_choice='auto')"
REPEATS_CALLS = ("SmolLM2-135M, forced to call with parallel calls allowed, keeps appending "
                 "calls to the list until max_tokens")
LONG_ARGUMENT = "SmolLM2-135M writes the free-text description argument past max_tokens"


class TestChatInferScaleIntegration(ChatModelIntegrationTests):
    shared_engine: MemoryEngine | None = None

    @pytest.fixture(autouse=True)
    def _use_session_engine(self, engine: MemoryEngine) -> None:
        if type(self).shared_engine is None:
            engine.memory.add(["The user's name is Dana.", "Dana writes haikus."], user_id=USER)
        type(self).shared_engine = engine

    @property
    def chat_model_class(self) -> type[ChatInferScale]:
        return ChatInferScale

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Short answers keep the suite fast on 2 CPU cores (a forced call or a structured
        # answer needs up to about 60 tokens); every call injects two facts.
        return {"engine": self.shared_engine, "user_id": USER, "k": 2, "max_tokens": 64}

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def has_tool_calling(self) -> bool:
        # SmolLM2's chat template has no tools: the engine writes its own tool prompt, and
        # the suite's tool_choice="any" is guided decoding, which any model follows.
        return True

    @property
    def has_structured_output(self) -> bool:
        return True  # function_calling (a forced call of the schema), guided decoding too

    @property
    def structured_output_kwargs(self) -> dict[str, Any]:
        # The answer itself under the schema. "function_calling" (a forced call of the
        # schema, with the tool prompt) makes SmolLM2-135M repeat itself inside the first
        # string until max_tokens; test_tools.py runs that method on Qwen2.5's template.
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine serves one model

    @pytest.mark.xfail(run=False, reason=WRONG_ARGUMENT)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: Any) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(run=False, reason=WRONG_ARGUMENT)
    async def test_tool_calling_async(self, model: Any) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(run=False, reason=NO_CALL_ON_ITS_OWN)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(run=False, reason="json_mode constrains the answer to some JSON "
                       "object only; SmolLM2-135M does not write the keys the prompt asks for")
    def test_json_mode(self, model: Any) -> None:
        super().test_json_mode(model)

    @pytest.mark.xfail(run=False, reason=REPEATS_CALLS)
    def test_tool_calling_with_no_arguments(self, model: Any) -> None:
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(run=False, reason=REPEATS_CALLS)
    def test_bind_runnables_as_tools(self, model: Any) -> None:
        super().test_bind_runnables_as_tools(model)

    @pytest.mark.xfail(run=False, reason=LONG_ARGUMENT)
    def test_unicode_tool_call_integration(self, model: Any, *, tool_choice: str | None = None,
                                           force_tool_call: bool = True) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice,
                                                   force_tool_call=force_tool_call)
