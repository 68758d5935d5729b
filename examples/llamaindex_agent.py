"""A LlamaIndex FunctionAgent with a tool, whose LLM gets the user's facts injected as KV.

``InferScaleMemoryBlock`` hands the user's facts to ``InferScaleLLM`` at each step; the
engine injects them and, as SmolLM2's chat template has no tools, writes the tools into
the prompt itself. ``initial_tool_choice`` forces the first call (guided decoding).

Run: ``python examples/llamaindex_agent.py`` (after ``scripts/setup.sh test``).
"""

# No "from __future__ import annotations": LlamaIndex builds the tool's schema from the
# function's annotations, and cannot resolve them as strings.
import asyncio
import tempfile
from typing import Literal

from facts import CAROLINE
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.memory import Memory

from inferscale_memory import ChatResult, MemoryEngine
from llama_index_inferscale import InferScaleLLM, InferScaleMemoryBlock

QUESTION = "What is the weather where Caroline lives?"


# A city from a list: SmolLM2-135M, made to write a free-text argument, may not end it.
def get_weather(city: Literal["Berlin", "Paris", "Rome"]) -> str:
    """The weather in a city now."""
    return f"12 C and rain in {city}"


async def run(engine: MemoryEngine, user: str = "caroline") -> dict[str, list[object]]:
    """One question by KV and by text: the tool call, its result and the answer; returns
    each path's agent events."""
    engine.memory.add(CAROLINE, user_id=user)
    print(f"Q: {QUESTION}")
    return {mode: await ask(engine, user, mode) for mode in ("kv", "text")}


async def ask(engine: MemoryEngine, user: str, mode: str) -> list[object]:
    memory = Memory.from_defaults(session_id=f"{user}-{mode}", memory_blocks=[
        InferScaleMemoryBlock(engine=engine, user_id=user, k=10)])
    llm = InferScaleLLM(engine=engine, mode=mode, max_tokens=48)
    agent = FunctionAgent(tools=[get_weather], llm=llm, initial_tool_choice="get_weather")
    handler = agent.run(QUESTION, memory=memory)
    events = [event async for event in handler.stream_events()]
    for event in events:
        if isinstance(event, ToolCallResult):
            print(f"  tool call: {event.tool_name}({event.tool_kwargs}) -> {event.tool_output}")
        if isinstance(event, AgentOutput) and isinstance(event.raw, ChatResult):
            m = event.raw.metrics  # the engine's answer of this step
            print(f"  [{mode}] step: injected {m.injected_tokens} tokens, {m.cached_tokens} "
                  f"cached, computed {m.computed_tokens}, TTFT {m.ttft_ms:.0f} ms")
    print(f"  [{mode}] A: {await handler}")
    return events


def main() -> None:
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        asyncio.run(run(engine))


if __name__ == "__main__":
    main()
