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
        # Short answers keep the suite fast on 2 CPU cores; every call injects two facts.
        return {"engine": self.shared_engine, "user_id": USER, "k": 2, "max_tokens": 12}

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def has_tool_calling(self) -> bool:
        # SmolLM2's chat template has no tools section: the engine refuses tools on it.
        # test_tools.py runs them on an engine with a tool template.
        return False

    @property
    def has_structured_output(self) -> bool:
        return False  # the suite's checks need a model that follows the prompt (see test_tools.py)

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine serves one model
