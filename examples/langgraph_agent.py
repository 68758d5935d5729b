"""A LangChain agent with a tool, whose model gets each user's facts injected as KV.

``create_agent`` builds the graph, LangGraph's checkpointer keeps the thread, and
``ChatInferScale`` injects the facts of the run's ``user_id``. SmolLM2-135M seldom calls a
tool on its own, so a middleware forces one call (``tool_choice="any"``, guided decoding)
until the tool has answered, then has the model answer in words (``"none"``).

Run: ``python examples/langgraph_agent.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile
from typing import Any, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

FACTS = ["Caroline moved to Berlin in May 2023.", "Caroline works as a nurse."]
QUESTIONS = ["What is the weather where Caroline lives?", "What is the weather in Paris?"]


# A city from a list: SmolLM2-135M, made to write a free-text argument, may not end it.
def get_weather(city: Literal["Berlin", "Paris", "Rome"]) -> str:
    """The weather in a city now."""
    return f"12 C and rain in {city}"


def this_turn(messages: list[AnyMessage]) -> list[AnyMessage]:
    """The messages from the last question on."""
    return messages[max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage)):]


@wrap_model_call
def tool_first(request: Any, handler: Any) -> Any:
    """Force one tool call until this turn has a tool result, then answer in words."""
    if any(isinstance(m, ToolMessage) for m in this_turn(request.messages)):
        return handler(request.override(tool_choice="none"))
    settings = {**request.model_settings, "parallel_tool_calls": False}
    return handler(request.override(tool_choice="any", model_settings=settings))


def run(engine: MemoryEngine, user: str = "caroline") -> list[list[AnyMessage]]:
    """Two questions in one thread; print the tool calls, answers and memory metrics."""
    engine.memory.add(FACTS, user_id=user)
    agent = create_agent(ChatInferScale(engine=engine, max_tokens=48), tools=[get_weather],
                         middleware=[tool_first], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "demo", "user_id": user}}
    turns = []
    for question in QUESTIONS:
        print(f"Q: {question}")
        turn = this_turn(agent.invoke({"messages": [HumanMessage(question)]}, config)["messages"])
        for message in turn:
            for call in getattr(message, "tool_calls", []):
                print(f"tool call: {call['name']}({call['args']})")
            if isinstance(message, ToolMessage):
                print(f"tool result: {message.content}")
        memory = turn[-1].response_metadata["memory"]
        print(f"A: {turn[-1].content}")
        print(f"   {len(memory['fact_ids'])} facts: {memory['injected_tokens']} tokens injected,"
              f" {memory['cached_tokens']} from the prefix cache, TTFT {memory['ttft_ms']:.0f} ms")
        turns.append(turn)
    return turns


def main() -> None:
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        run(engine)


if __name__ == "__main__":
    main()
