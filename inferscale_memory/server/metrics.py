"""Prometheus metrics of the server, in a registry of its own (one per app).

Chat answers feed the TTFT histogram (by mode), token counters, the answers without
memory (by reason: ``off``, memory off or no user; ``no_facts``, a user with no facts yet)
and the recompute fallbacks; :class:`~inferscale_memory.server.middleware.RequestCounter`
counts requests by route, method and status; the engine's fact-KV pool counters
(:class:`~inferscale_memory.results.KVStats`: hits, misses, captures, evictions, demotions,
promotions, rows held) are read at each scrape, with the bytes of the device pool's rows;
the store's fact and user counts are refreshed when ``/metrics`` is scraped (at most every
``refresh_s`` seconds: two counts in one SQL query, in a worker thread).

No metric has a user label: ``/metrics`` is served without an API key, and a label per
user would publish user ids (and grow without bound with the users).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferscale_memory.results import ChatMetrics
from inferscale_memory.store.threads import in_store_thread

if TYPE_CHECKING:
    from inferscale_memory.engine import MemoryEngine

logger = logging.getLogger(__name__)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                10.0, 30.0)


class ServerMetrics:
    """The server's metrics.

    Args:
        engine: The engine whose store and model the gauges describe.
        refresh_s: Shortest time between two counts of the store.
    """

    def __init__(self, engine: MemoryEngine, refresh_s: float = 15.0) -> None:
        self._engine = engine
        self._refresh_s = refresh_s
        self._refreshed = float("-inf")
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("inferscale_chat_ttft_seconds",
                              "Time to first token of chat answers (retrieval included)",
                              ["mode"], buckets=TTFT_BUCKETS, registry=r)
        self.answers = Counter("inferscale_chat_answers", "Chat answers by memory mode",
                               ["mode"], registry=r)
        self.answers_without_memory = Counter(
            "inferscale_chat_answers_without_memory",
            "Chat answers with no fact in the prompt, by reason: off (memory off or no "
            "user) or no_facts (a user with no facts yet)", ["reason"], registry=r)
        self.prompt_tokens = Counter("inferscale_chat_prompt_tokens",
                                     "Prompt tokens of chat answers", registry=r)
        self.injected_tokens = Counter("inferscale_chat_injected_tokens",
                                       "Prompt tokens whose KV was injected from memory",
                                       registry=r)
        self.computed_tokens = Counter("inferscale_chat_computed_prompt_tokens",
                                       "Prompt tokens the engine computed", registry=r)
        self.completion_tokens = Counter("inferscale_chat_completion_tokens",
                                         "Generated tokens", registry=r)
        self.recomputed_facts = Counter(
            "inferscale_recomputed_facts",
            "Facts named for injection whose KV was missing and were recomputed from text",
            registry=r)
        self.recompute_fallbacks = Counter(
            "inferscale_recompute_fallbacks", "Chat answers that recomputed at least one fact",
            registry=r)
        self.memory_ops = Counter("inferscale_memory_operations",
                                  "Memory API operations by kind", ["op"], registry=r)
        self.requests = Counter("inferscale_http_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.facts = Gauge("inferscale_facts", "Facts in the store", registry=r)
        self.users = Gauge("inferscale_fact_users", "Users that have stored facts", registry=r)
        r.register(KVStatsCollector(engine))

    def observe_chat(self, metrics: ChatMetrics, mode: str) -> None:
        """Record one finished chat answer (``mode``: kv, text or off)."""
        if metrics.output_tokens:
            self.ttft.labels(mode).observe(metrics.ttft_ms / 1000)
        self.answers.labels(mode).inc()
        if not metrics.memory_used:
            self.answers_without_memory.labels("off" if mode == "off" else "no_facts").inc()
        self.prompt_tokens.inc(metrics.prompt_tokens)
        self.injected_tokens.inc(metrics.injected_tokens)
        self.computed_tokens.inc(metrics.computed_tokens)
        self.completion_tokens.inc(metrics.output_tokens)
        if metrics.recomputed_fact_ids:
            self.recomputed_facts.inc(len(metrics.recomputed_fact_ids))
            self.recompute_fallbacks.inc()

    async def render(self) -> bytes:
        """The metrics in Prometheus' text format (refreshing the store gauges if due)."""
        if time.monotonic() - self._refreshed >= self._refresh_s:
            self._refreshed = time.monotonic()
            try:
                await self._refresh_store()
            except Exception:  # a scrape must not fail because of the store
                logger.exception("could not refresh the store metrics")
        return generate_latest(self.registry)

    async def _refresh_store(self) -> None:
        users, facts = await in_store_thread(self._engine.store.counts)
        self.facts.set(facts)
        self.users.set(users)


def _kv_bytes_per_token(engine: MemoryEngine) -> int:
    """K and V bytes of one token over all layers, from the model's ``config.json``."""
    try:
        config = json.loads((engine.model_path / "config.json").read_text())
        config = config.get("text_config", config)
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(config.get("head_dim")
                       or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return 0
    dtype = str(engine.config.dtype if engine.config.dtype != "auto"
                else config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    width = 4 if "32" in dtype else 2
    return 2 * layers * heads * head_dim * width


KV_COUNTERS = (
    ("captured", "inferscale_kv_captured_facts", "Facts (and headers) whose KV was captured"),
    ("injected", "inferscale_kv_injected_facts", "Facts whose KV an answer loaded (hits)"),
    ("recomputed", "inferscale_kv_missed_facts",
     "Facts an answer named whose KV was gone, computed from text instead (misses)"),
    ("evicted", "inferscale_kv_evicted_facts", "Facts dropped from the pool to make room"),
    ("demoted", "inferscale_kv_demoted_facts", "Facts moved to the host-memory tier"),
    ("promoted", "inferscale_kv_promoted_facts",
     "Facts copied back from the host-memory tier for an answer (host hits)"),
    ("deleted", "inferscale_kv_deleted_facts",
     "Facts whose KV a delete or an update dropped from the pool"),
)
KV_GAUGES = (
    ("pool_tokens", "inferscale_kv_pool_tokens", "Token rows of fact KV on the device"),
    ("budget_tokens", "inferscale_kv_pool_budget_tokens",
     "The device pool's budget in token rows (kv_pool_gb)"),
    ("host_tokens", "inferscale_kv_host_tokens", "Token rows of fact KV in host memory"),
    ("host_budget_tokens", "inferscale_kv_host_budget_tokens",
     "The host tier's budget in token rows (kv_host_pool_gb; absent without a tier)"),
)


class KVStatsCollector:
    """The engine's :attr:`~inferscale_memory.engine.MemoryEngine.kv_stats`, read at each
    scrape."""

    def __init__(self, engine: MemoryEngine) -> None:
        self._engine = engine
        self._bytes_per_token = _kv_bytes_per_token(engine)

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.kv_stats
        for field, name, help_text in KV_COUNTERS:
            yield CounterMetricFamily(name, help_text, value=getattr(stats, field))
        for field, name, help_text in KV_GAUGES:
            value = getattr(stats, field)
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
        if self._bytes_per_token:
            yield GaugeMetricFamily(
                "inferscale_kv_pool_bytes", "Bytes of fact KV on the device (pool rows x "
                "K and V bytes of one token over all layers)",
                value=stats.pool_tokens * self._bytes_per_token)
