"""A fact-KV owner without a model: vLLM's runtime (the edge) as a stand-in that holds
each capture until the test opens its gate, a hashing embedder, and what FactKV reads of
the prompt builder."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

import numpy as np

from inferscale_memory.connector.report import ConnectorReport


class HashEmbedder:
    dim = 16

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], np.uint8)
                for t in texts]
        out = np.asarray(rows, np.float32) + 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class HeldRuntime:
    """vLLM's side of a capture: records which facts each request captures and answers
    when the test opens the gate."""

    max_model_len = 4096

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.captured: list[str] = []

    async def control(self, token_ids: list[int], params: object) -> ConnectorReport:
        self.captured += [span.key.name for span in params.capture[1:]]
        await self.gate.wait()
        return ConnectorReport()


BUILDER = SimpleNamespace(  # what FactKV's captures read of the prompt builder
    header_name="header:L", header_ids=[1, 2, 3], layout_id="L",
    capture_prompt=lambda text, context=(): ([1, 2, 3] + [7] * (4 * len(context) + 4),
                                             3 + 4 * len(context), 7 + 4 * len(context)))
