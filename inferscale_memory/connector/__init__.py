"""The vLLM KV connector of inferscale-memory and its configuration.

Only this package touches vLLM internals; :mod:`.compat` holds the version shims.
"""

from __future__ import annotations

from typing import Any

CONNECTOR_MODULE = "inferscale_memory.connector.connector"
CONNECTOR_CLASS = "InferScaleConnector"


def kv_transfer_config(extra: dict[str, Any] | None = None) -> Any:
    """vLLM's ``KVTransferConfig`` that loads :class:`InferScaleConnector`."""
    from inferscale_memory.connector.compat import kv_transfer_config as make

    return make(CONNECTOR_MODULE, CONNECTOR_CLASS, extra or {})
