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

from facts import CAROLINE
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

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


def run(engine: MemoryEngine, user: str = "caroline") -> dict[str, list[list[AnyMessage]]]:
    """Two questions in one thread, by KV and by text; returns each path's turns."""
    engine.memory.add(CAROLINE, user_id=user)
    agents = {mode: create_agent(ChatInferScale(engine=engine, k=10, mode=mode, max_tokens=48),
                                 tools=[get_weather], middleware=[tool_first],
                                 checkpointer=InMemorySaver()) for mode in ("kv", "text")}
    config = {"configurable": {"thread_id": "demo", "user_id": user}}
    turns: dict[str, list[list[AnyMessage]]] = {mode: [] for mode in agents}
    for question in QUESTIONS:
        print(f"Q: {question}")
        for mode, agent in agents.items():
            messages = agent.invoke({"messages": [HumanMessage(question)]}, config)["messages"]
            turns[mode].append(show(mode, this_turn(messages)))
    return turns


def show(mode: str, turn: list[AnyMessage]) -> list[AnyMessage]:
    """Print each model step (a tool call or the answer) with what it injected, reused
    from vLLM's prefix cache (an earlier step's facts) and computed; and the tool results."""
    for message in turn[1:]:
        if isinstance(message, ToolMessage):
            print(f"  tool result: {message.content}")
            continue
        m = message.response_metadata["memory"]
        said = ", ".join(f"{c['name']}({c['args']})" for c in message.tool_calls)
        print(f"  [{mode}] injected {m['injected_tokens']} tokens, {m['cached_tokens']} cached, "
              f"computed {m['computed_tokens']}, TTFT {m['ttft_ms']:.0f} ms: "
              f"{said or repr(message.content)}")
    return turn


def main() -> None:
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        run(engine)


if __name__ == "__main__":
    main()
