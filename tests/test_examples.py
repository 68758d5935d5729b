"""The agent examples, run on the shared engine: each must call its tool, get the result
back and answer with the user's facts injected."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferscale_memory import ChatResult, MemoryEngine

pytestmark = pytest.mark.engine
EXAMPLES = Path(__file__).parents[1] / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the tools' annotations there
    spec.loader.exec_module(module)
    return module


def test_the_langgraph_agent_calls_its_tool_then_answers_each_turn(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    from langchain_core.messages import AIMessage, ToolMessage

    turns = example("langgraph_agent").run(engine, user="example-langgraph")
    assert len(turns) == 2
    for turn in turns:
        call, *results, answer = turn[1:]  # the question, then these
        assert {c["name"] for c in call.tool_calls} == {"get_weather"}
        assert len(results) == len(call.tool_calls)
        assert all(isinstance(r, ToolMessage) and r.content.startswith("12 C and rain")
                   for r in results)
        assert isinstance(answer, AIMessage) and answer.content and not answer.tool_calls
        assert answer.response_metadata["memory"]["memory_used"]
    assert capsys.readouterr().out.count("tool result: 12 C and rain") >= 2


def test_the_llamaindex_agent_calls_its_tool_then_answers(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    from llama_index.core.agent.workflow import AgentOutput, ToolCallResult

    events = asyncio.run(example("llamaindex_agent").run(engine, user="example-llamaindex"))
    results = [e for e in events if isinstance(e, ToolCallResult)]
    assert results and {r.tool_name for r in results} == {"get_weather"}
    assert all(str(r.tool_output).startswith("12 C and rain") for r in results)
    steps = [e.raw for e in events if isinstance(e, AgentOutput) and isinstance(e.raw, ChatResult)]
    assert len(steps) >= 2 and steps[0].tool_calls  # the forced call, then the answer
    assert steps[-1].text and not steps[-1].tool_calls
    assert all(step.metrics.memory_used for step in steps)
    assert "A: " in capsys.readouterr().out
