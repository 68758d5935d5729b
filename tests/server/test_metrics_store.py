"""The store gauges of /metrics: exact counts from the store, O(1) per scrape.

The metrics read only the engine's store, counters and model config, so they run here on a
real SQLite store without an engine (the real server's scrape: test_server_robustness.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferscale_memory import MemoryConfig
from inferscale_memory.embeddings import default_embedder
from inferscale_memory.results import KVStats
from inferscale_memory.server.metrics import ServerMetrics
from inferscale_memory.store import MemoryStore


def scrape(metrics: ServerMetrics) -> dict[str, float]:
    text = asyncio.run(metrics.render()).decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


@pytest.fixture
def engine(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_key_value_heads": 2, "num_attention_heads": 4,
        "hidden_size": 64, "torch_dtype": "bfloat16"}))
    with MemoryStore(str(tmp_path / "memory.sqlite"), default_embedder()) as store:
        yield SimpleNamespace(store=store, kv_stats=KVStats(), model_path=model,
                              config=MemoryConfig())


def test_store_gauges_count_without_walking_the_facts(engine, monkeypatch) -> None:
    store = engine.store
    store.add(["Ada rides a red bike.", "Ada lives in Leeds."], user_id="ada")
    store.add("Bo bakes bread.", user_id="bo")
    gone = store.add("Cy is leaving.", user_id="cy")
    store.delete(gone.id, user_id="cy")

    def walked(*args, **kwargs):
        raise AssertionError("a scrape must not list the facts of every user")

    monkeypatch.setattr(store, "list", walked)
    metrics = ServerMetrics(engine, refresh_s=0)  # type: ignore[arg-type]
    samples = scrape(metrics)
    assert samples["inferscale_facts"] == 3
    assert samples["inferscale_fact_users"] == 3  # cy stored a fact once
    store.delete_all(user_id="ada")
    assert scrape(metrics)["inferscale_facts"] == 1


def test_pool_bytes_are_the_pool_rows_times_the_kv_bytes_per_token(engine) -> None:
    engine.kv_stats.pool_tokens = 10
    samples = scrape(ServerMetrics(engine, refresh_s=0))  # type: ignore[arg-type]
    # 2 (K and V) x 2 layers x 2 KV heads x head_dim 16 x 2 bytes (bf16) per row
    assert samples["inferscale_kv_pool_bytes"] == 10 * 2 * 2 * 2 * 16 * 2
