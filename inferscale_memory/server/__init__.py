"""An OpenAI-compatible chat server with per-user memory, and a memories API.

:func:`create_app` builds the FastAPI app around an existing
:class:`~inferscale_memory.MemoryEngine`; :func:`start_server` serves it on the engine's
event loop (on a socket from :func:`bind`, if given); :func:`serve` is the
``inferscale-memory serve`` command. Needs the ``server`` extra (FastAPI, uvicorn,
prometheus-client).
"""

from inferscale_memory.errors import MissingDependencyError

try:
    import fastapi  # noqa: F401
    import prometheus_client  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        f"the server needs {exc.name}: pip install 'inferscale-memory[server]'") from exc

from inferscale_memory.server.app import create_app
from inferscale_memory.server.auth import ApiKeys
from inferscale_memory.server.run import ServerHandle, bind, serve, start_server

__all__ = ["ApiKeys", "ServerHandle", "bind", "create_app", "serve", "start_server"]
