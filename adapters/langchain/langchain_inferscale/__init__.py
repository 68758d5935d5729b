"""LangChain integration of inferscale-memory: answers with the user's facts injected as KV.

Example:
    >>> from langchain_inferscale import ChatInferScale           # doctest: +SKIP
    >>> llm = ChatInferScale(engine=engine, user_id="caroline")
    >>> llm.invoke("Where does Caroline live?").content
"""

from langchain_inferscale.chat_models import ChatInferScale
from langchain_inferscale.embeddings import InferScaleEmbeddings
from langchain_inferscale.retrievers import InferScaleRetriever

__all__ = ["ChatInferScale", "InferScaleEmbeddings", "InferScaleRetriever"]
