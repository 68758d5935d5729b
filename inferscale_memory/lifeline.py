"""vLLM's processes end when the process that owns the engine dies.

vLLM runs its engine core (and, on some executors, each worker) in child processes. When
the owner dies without shutting the engine down (``kill -9``, an OOM kill), nothing tells
them: they live on holding host and GPU memory, and a supervisor that restarts the server
piles them up. The engine marks its children with :data:`OWNER_ENV`; each of them watches
its parent (the engine core watches the owner, a worker the engine core) and ends when the
parent is gone, so the whole tree follows the owner.

A Ctrl-C in a terminal interrupts the whole process group, vLLM's processes included; they
ignore it (:func:`leave_interrupts_to_owner`), so the owner shuts the engine down in order
instead of finding its engine already dead.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)
OWNER_ENV = "INFERSCALE_ENGINE_OWNER"  # pid of the process that started the engine
POLL_S = 0.5
GRACE_S = 10.0  # after SIGTERM (vLLM's own shutdown), the hard exit

_watching = False


def mark_owner() -> None:
    """Called by the engine's owner before vLLM starts its processes (they inherit it)."""
    os.environ[OWNER_ENV] = str(os.getpid())


def watch_parent() -> None:
    """In a process vLLM started for an engine: end it when its parent dies.

    Idempotent; does nothing in the owner itself or outside an engine's process tree.
    """
    global _watching
    owner = os.environ.get(OWNER_ENV)
    if _watching or owner is None or owner == str(os.getpid()) or not owner.isdigit():
        return
    _watching = True
    # The owner's pid comes from the environment, not from getppid(): an owner that died
    # before this runs has handed its children to another parent already.
    threading.Thread(target=_watch, args=(os.getppid(), int(owner)),
                     name="inferscale-lifeline", daemon=True).start()


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leave_interrupts_to_owner() -> None:
    """In a process vLLM started for an engine: ignore SIGINT (the owner gets it too and
    stops the engine with SIGTERM, or :func:`watch_parent` ends it if the owner dies)."""
    owner = os.environ.get(OWNER_ENV)
    if owner is None or owner == str(os.getpid()):
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch(parent: int, owner: int) -> None:
    # A dead parent's children are handed to another; the owner is checked itself too,
    # so a worker does not wait for the engine core between them to notice.
    while os.getppid() == parent and is_alive(owner):
        time.sleep(POLL_S)
    logger.warning("the engine's owner (pid %d) is gone: stopping pid %d", owner,
                   os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # vLLM's handler shuts the process down
    time.sleep(GRACE_S)
    os._exit(1)
