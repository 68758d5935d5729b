"""ChatInferScale in a LangChain chain: the user's facts are injected as KV, not pasted.

Run: ``python examples/langchain_chat.py`` (after ``scripts/setup.sh test``).
"""

from __future__ import annotations

import tempfile

from facts import CAROLINE
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from inferscale_memory import MemoryEngine
from langchain_inferscale import ChatInferScale, InferScaleRetriever


def run(engine: MemoryEngine, user: str = "caroline") -> list[AIMessage]:
    """Answer one question by KV and by text; stream a second one; show the retriever."""
    engine.memory.add(CAROLINE, user_id=user)
    llm = ChatInferScale(engine=engine, k=10, max_tokens=48)
    config = {"configurable": {"user_id": user}}
    replies = [llm.invoke("Where does Caroline live?", config=config, mode=mode)
               for mode in ("kv", "text")]
    for mode, reply in zip(("kv", "text"), replies, strict=True):
        m = reply.response_metadata["memory"]
        print(f"[{mode}] injected {m['injected_tokens']} tokens, computed "
              f"{m['computed_tokens']}, TTFT {m['ttft_ms']:.0f} ms: {reply.content!r}")
    chain = ChatPromptTemplate.from_messages([("system", "Answer in one sentence."),
                                              ("user", "{question}")]) | llm
    for chunk in (chain | StrOutputParser()).stream(
            {"question": "Who is Caroline's sister?"}, config=config):
        print(chunk, end="", flush=True)
    print()
    docs = InferScaleRetriever(engine=engine, user_id=user, k=1).invoke("sister")
    print("retrieved:", [doc.page_content for doc in docs])
    return replies


def main() -> None:
    # A store of its own: the example never touches your default store's users.
    with tempfile.TemporaryDirectory() as folder, \
            MemoryEngine(store_path=f"{folder}/memory.sqlite") as engine:
        run(engine)


if __name__ == "__main__":
    main()
