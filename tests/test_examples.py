"""The examples, run on the shared engine: each must answer with the user's facts injected
(at a k where the default quality policy injects some) and print what the KV path injected
beside the text path; the agents must call their tool and get the result back."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferscale_memory import ChatResult, MemoryConfig, MemoryEngine
from inferscale_memory.layout import tail_size

pytestmark = pytest.mark.engine
EXAMPLES = Path(__file__).parents[1] / "examples"
DEFAULT_TAIL = MemoryConfig.model_fields["recompute_tail"].default


def example(name: str) -> ModuleType:
    if str(EXAMPLES) not in sys.path:  # the examples import their facts from examples/
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the tools' annotations there
    spec.loader.exec_module(module)
    return module


def injects_facts(fact_ids: list[str], injected_tokens: int) -> bool:
    """Whether an answer injected facts here and would with the default quality policy.

    The shared engine injects every fact (``recompute_tail=0``); the default policy
    computes the last ``DEFAULT_TAIL`` facts from text, and every fact of a prompt with 5
    or fewer: an example that retrieves so few shows nothing of the product.
    """
    return injected_tokens > 0 and tail_size(len(fact_ids), DEFAULT_TAIL, False) < len(fact_ids)


def printed_both_paths(out: str) -> bool:
    """Whether the output shows the KV path injecting and the text path computing all."""
    return bool(re.search(r"\[kv\] (step: )?injected [1-9]\d* tokens, [^\n]*computed \d", out)
                and re.search(r"\[text\] (step: )?injected 0 tokens, [^\n]*computed [1-9]", out))


def test_the_langchain_chat_injects_the_facts_and_shows_both_paths(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    kv, text = example("langchain_chat").run(engine, user="example-langchain")
    memory = kv.response_metadata["memory"]
    assert injects_facts(memory["fact_ids"], memory["injected_tokens"])
    assert text.response_metadata["memory"]["injected_tokens"] == 0
    assert printed_both_paths(capsys.readouterr().out)


def test_the_llamaindex_chat_engine_injects_the_facts_each_turn(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    seen = example("llamaindex_chat_engine").run(engine, user="example-llamaindex-chat")
    assert [m["mode"] for m in seen] == ["kv", "text"] * 2
    assert all(injects_facts(m["fact_ids"], m["injected_tokens"])
               for m in seen if m["mode"] == "kv")
    assert printed_both_paths(capsys.readouterr().out)


def test_the_mem0_example_injects_mem0s_search_results(
        engine: MemoryEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kv, text = example("mem0_memory").run(engine, str(tmp_path), user="example-mem0")
    assert injects_facts(kv.metrics.fact_ids, kv.metrics.injected_tokens)
    assert text.metrics.injected_tokens == 0
    out = capsys.readouterr().out
    assert printed_both_paths(out) and "history: ['ADD', 'UPDATE', 'DELETE']" in out
    # every fact but the deleted one (Mem0's get_all lists 20 unless told how many)
    assert f"left: {len(example('facts').CAROLINE) - 1} memories" in out


def test_the_openai_client_injects_the_facts_it_stored_through_the_server(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    from inferscale_memory.server import create_app, start_server

    handle = start_server(create_app(engine, metrics_refresh_s=0), engine)
    try:
        kv, text, off = example("openai_client").run(f"{handle.url}/v1")
    finally:
        handle.stop(timeout=60)
    assert injects_facts(kv.memory["fact_ids"], kv.usage.injected_tokens)
    assert text.usage.injected_tokens == 0 and not off.memory["fact_ids"]
    assert printed_both_paths(capsys.readouterr().out)


def test_the_langgraph_agent_calls_its_tool_then_answers_each_turn(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    from langchain_core.messages import AIMessage, ToolMessage

    turns = example("langgraph_agent").run(engine, user="example-langgraph")
    assert len(turns["kv"]) == len(turns["text"]) == 2
    for turn in turns["kv"]:
        call, *results, answer = turn[1:]  # the question, then these
        assert {c["name"] for c in call.tool_calls} == {"get_weather"}
        assert len(results) == len(call.tool_calls)
        assert all(isinstance(r, ToolMessage) and r.content.startswith("12 C and rain")
                   for r in results)
        assert isinstance(answer, AIMessage) and answer.content and not answer.tool_calls
        memory = call.response_metadata["memory"]
        assert injects_facts(memory["fact_ids"], memory["injected_tokens"])
        # the answer's facts are the call's, reused from vLLM's prefix cache: none computed
        assert answer.response_metadata["memory"]["injected_fact_ids"]
    out = capsys.readouterr().out
    assert out.count("tool result: 12 C and rain") >= 4 and printed_both_paths(out)


def test_the_llamaindex_agent_calls_its_tool_then_answers(
        engine: MemoryEngine, capsys: pytest.CaptureFixture[str]) -> None:
    from llama_index.core.agent.workflow import AgentOutput, ToolCallResult

    runs = asyncio.run(example("llamaindex_agent").run(engine, user="example-llamaindex"))
    events = runs["kv"]
    results = [e for e in events if isinstance(e, ToolCallResult)]
    assert results and {r.tool_name for r in results} == {"get_weather"}
    assert all(str(r.tool_output).startswith("12 C and rain") for r in results)
    steps = [e.raw for e in events if isinstance(e, AgentOutput) and isinstance(e.raw, ChatResult)]
    assert len(steps) >= 2 and steps[0].tool_calls  # the forced call, then the answer
    assert steps[-1].text and not steps[-1].tool_calls
    assert injects_facts(steps[0].metrics.fact_ids, steps[0].metrics.injected_tokens)
    assert all(step.metrics.injected_fact_ids for step in steps)  # later: the prefix cache
    out = capsys.readouterr().out
    assert "[kv] A: " in out and "[text] A: " in out and printed_both_paths(out)
