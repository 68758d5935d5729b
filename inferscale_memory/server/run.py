"""Running the app: uvicorn on the engine's own event loop.

The handlers then await the engine's async API directly. :func:`start_server` is what
tests and embedding applications use; :func:`serve` is the ``serve`` command (it builds the
engine, serves until SIGINT/SIGTERM, lets in-flight requests finish, then stops the engine).
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from inferscale_memory.errors import ConfigError, EngineError
from inferscale_memory.server.context import MAX_TOKENS_LIMIT

if TYPE_CHECKING:
    from fastapi import FastAPI

    from inferscale_memory.engine import MemoryEngine

logger = logging.getLogger(__name__)
LOCALHOST = "127.0.0.1"


class ServerHandle:
    """A uvicorn server running on an engine's loop.

    Attributes:
        host: The bound address.
        port: The bound port (the real one when 0 was asked for).
        url: ``http://host:port``.
    """

    def __init__(self, server: uvicorn.Server, future: Future[None], host: str,
                 port: int) -> None:
        self._server = server
        self._future = future
        self.host = host
        self.port = port
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"

    @property
    def running(self) -> bool:
        """Whether the server still serves."""
        return not self._future.done()

    def request_stop(self, force: bool = False) -> None:
        """Ask the server to stop (from any thread); ``force`` skips waiting for requests."""
        self._server.should_exit = True
        if force:
            self._server.force_exit = True

    def stop(self, timeout: float | None = 60) -> None:
        """Stop accepting connections, let in-flight requests finish, then return.

        Args:
            timeout: Longest wait for the server to finish (uvicorn cancels requests still
                running after its ``timeout_graceful_shutdown``).
        """
        self.request_stop()
        self._future.result(timeout)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until the server stops (signals stay deliverable to the main thread)."""
        while True:
            try:
                self._future.result(poll_s)
                return
            except FutureTimeout:
                continue


def start_server(app: FastAPI, engine: MemoryEngine, host: str = LOCALHOST, port: int = 0, *,
                 sock: socket.socket | None = None, graceful_timeout_s: int = 30,
                 startup_timeout_s: float = 30.0, **uvicorn_options: Any) -> ServerHandle:
    """Serve ``app`` on ``engine``'s event loop and return once it accepts connections.

    Args:
        app: From :func:`~inferscale_memory.server.app.create_app` over ``engine``.
        engine: The engine whose loop runs the server.
        host: Address to bind.
        port: Port to bind; 0 picks a free one (see :attr:`ServerHandle.port`).
        sock: A socket from :func:`bind` to serve on instead of binding ``host`` and
            ``port`` (the server then owns it).
        graceful_timeout_s: How long in-flight requests may run on shutdown.
        startup_timeout_s: Longest wait for the server to start.
        **uvicorn_options: More :class:`uvicorn.Config` options (``limit_concurrency``...).

    Raises:
        OSError: The address cannot be bound.
        EngineError: The server did not start.
    """
    if sock is None:
        sock = bind(host, port)
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False,
                            timeout_graceful_shutdown=graceful_timeout_s, **uvicorn_options)
    server = uvicorn.Server(config)

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits on startup failures; keep the loop alive
            raise EngineError(f"the server failed to start (exit {exc.code})") from None

    future = engine.runtime.submit(serve())
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if future.done():
            sock.close()
            future.result()
            raise EngineError("the server stopped during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise EngineError(f"the server did not start within {startup_timeout_s} s")
        time.sleep(0.02)
    bound_host, bound_port = sock.getsockname()[:2]
    logger.info("serving %s on http://%s:%d", app.title, bound_host, bound_port)
    return ServerHandle(server, future, bound_host, bound_port)


def serve(model: str | None = None, host: str | None = None, port: int = 8000,
          api_keys_path: Path | None = None, *, max_tokens_limit: int | None = MAX_TOKENS_LIMIT,
          **engine_options: Any) -> None:
    """The ``serve`` command: build the engine, serve until a signal, shut down cleanly.

    Without API keys (``api_keys_path`` or ``$INFERSCALE_API_KEYS``) the server warns and
    binds to 127.0.0.1 whatever ``host`` says. The address is bound before the engine
    starts.

    Raises:
        ConfigError: The address cannot be bound (a port in use or outside 0-65535, a
            host that does not resolve); nothing was started.
    """
    from inferscale_memory.engine import MemoryEngine
    from inferscale_memory.server.app import create_app
    from inferscale_memory.server.auth import ApiKeys

    keys = ApiKeys.load(api_keys_path)
    host = host or LOCALHOST
    if keys is None:
        if not _is_loopback(host):
            logger.warning("no API keys configured: binding to %s instead of %s", LOCALHOST,
                           host)
            host = LOCALHOST
        logger.warning("no API keys configured (--api-keys FILE or $INFERSCALE_API_KEYS): "
                       "every local client may read and write every user's memory")
    # Bound before the engine's minutes-long start: a taken port fails at once, and no
    # socket the engine opens meanwhile can take this one.
    try:
        sock = bind(host, port)
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        raise ConfigError(f"cannot serve on {host}:{port}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    with sock:  # closed on every way out (the server closes it too as it stops)
        engine = MemoryEngine(model, **engine_options)
        try:
            app = create_app(engine, keys, max_tokens_limit=max_tokens_limit)
            handle = start_server(app, engine, sock=sock)
            signalled = threading.Event()

            def on_signal(signum: int, frame: Any) -> None:
                if signalled.is_set():
                    logger.warning("second signal: stopping without waiting for requests")
                else:
                    logger.info("stopping: waiting for in-flight requests (signal again to "
                                "stop now)")
                handle.request_stop(force=signalled.is_set())
                signalled.set()

            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, on_signal)
            # Printed once a signal stops the server in order (a supervisor may send one now).
            print(f"inferscale-memory serving {engine.model_name} on {handle.url}/v1",
                  flush=True)
            handle.wait()
            logger.info("server stopped; finishing background recaptures, then the engine")
            try:
                engine.wait_for_background(timeout=30)
            except Exception:  # the facts are durable; missing KV is recomputed on next use
                logger.exception("background recaptures did not finish")
        finally:
            engine.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket on ``host``:``port`` for :func:`start_server`.

    Raises:
        OSError: The address cannot be bound (in use, not this machine's, no permission).
        OverflowError: ``port`` is outside 0-65535.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
