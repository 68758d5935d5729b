"""The store's calls from the event loop run on threads of their own, enough for the
chats of a busy server to wait on the embedder at once (store/threads.py)."""

from __future__ import annotations

import asyncio
import threading

from inferscale_memory.store.threads import STORE_THREADS, in_store_thread


async def test_more_store_calls_wait_at_once_than_the_default_executor_has_threads() -> None:
    """The loop's default executor has at most 32 threads (6 on 2 cores): the searches of
    64 chats reached the embedder 6 at a time, so it could not run them as one batch."""
    callers = 40  # above the default executor's 32 on any machine
    assert callers <= STORE_THREADS
    together = threading.Barrier(callers, timeout=30)  # broken unless all 40 wait at once

    def search() -> str:
        together.wait()
        return threading.current_thread().name

    names = await asyncio.gather(*(in_store_thread(search) for _ in range(callers)))
    assert len(set(names)) == callers
    assert all(name.startswith("inferscale-store") for name in names)
