"""ChatInferScale in a LangChain chain: the user's facts are injected as KV, not pasted.

Run: ``python examples/langchain_chat.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale, InferScaleRetriever

USER = "caroline"


def main() -> None:
    """Answer one question by KV and by text; stream a second one; show the retriever."""
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        engine.memory.add(["Caroline moved to Berlin in May 2023.",
                           "Caroline's sister is called Ana."], user_id=USER)
        llm = ChatInferScale(engine=engine, max_tokens=48)
        config = {"configurable": {"user_id": USER}}
        for mode in ("kv", "text"):
            reply = llm.invoke("Where does Caroline live?", config=config, mode=mode)
            memory = reply.response_metadata["memory"]
            print(f"[{mode}] {reply.content!r}: TTFT {memory['ttft_ms']:.0f} ms, "
                  f"injected {memory['injected_tokens']}, computed {memory['computed_tokens']}")
        chain = ChatPromptTemplate.from_messages([("system", "Answer in one sentence."),
                                                  ("user", "{question}")]) | llm
        for chunk in (chain | StrOutputParser()).stream(
                {"question": "Who is Caroline's sister?"}, config=config):
            print(chunk, end="", flush=True)
        print()
        docs = InferScaleRetriever(engine=engine, user_id=USER, k=1).invoke("sister")
        print("retrieved:", [doc.page_content for doc in docs])


if __name__ == "__main__":
    main()
