"""LangChain's standard integration tests for ChatInferScale on the real engine."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

pytestmark = pytest.mark.engine
USER = "lc-standard"


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
        # Short answers keep the suite fast on 2 CPU cores (a forced tool call's JSON needs
        # about 20 tokens); every call injects two facts.
        return {"engine": self.shared_engine, "user_id": USER, "k": 2, "max_tokens": 32}

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
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine serves one model
