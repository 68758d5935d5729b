"""A LangGraph agent whose model gets each user's facts injected as KV.

LangChain's ``create_agent`` (the successor of LangGraph's ``create_react_agent``) builds
the graph; LangGraph's checkpointer keeps the thread (short-term memory) and
``ChatInferScale`` injects the user's facts (long-term memory) named by the run's config.
SmolLM2-135M-Instruct, the embedded default, cannot call tools, so this agent has none.

Run: ``python examples/langgraph_agent.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile

from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale

FACTS = ["Caroline moved to Berlin in May 2023.", "Caroline works as a nurse."]
QUESTIONS = ["Where does Caroline live?", "And what is her job?"]


def main() -> None:
    """Ask two questions in one thread; print each answer and its memory metrics."""
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        engine.memory.add(FACTS, user_id="caroline")
        agent = create_agent(ChatInferScale(engine=engine, max_tokens=48), tools=[],
                             checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "demo", "user_id": "caroline"}}
        for question in QUESTIONS:
            state = agent.invoke({"messages": [("user", question)]}, config)
            reply = state["messages"][-1]
            memory = reply.response_metadata["memory"]
            print(f"Q: {question}\nA: {reply.content}")
            print(f"   injected {memory['injected_tokens']} tokens of "
                  f"{len(memory['fact_ids'])} facts, TTFT {memory['ttft_ms']:.0f} ms")


if __name__ == "__main__":
    main()
