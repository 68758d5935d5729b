"""The vLLM KV connector of inferscale-memory and its configuration.

The class vLLM instantiates (:mod:`.connector`) is a thin shim over the scheduler and
worker sides; what they read of vLLM beyond the connector base API goes through the
driver (:mod:`inferscale_memory.driver`).
"""

from __future__ import annotations

from typing import Any

CONNECTOR_MODULE = "inferscale_memory.connector.connector"
CONNECTOR_CLASS = "InferScaleConnector"


def kv_transfer_config(extra: dict[str, Any] | None = None) -> Any:
    """vLLM's ``KVTransferConfig`` that loads :class:`InferScaleConnector`."""
    from inferscale_memory.driver.frontend import kv_transfer_config as make

    return make(CONNECTOR_MODULE, CONNECTOR_CLASS, extra or {})
