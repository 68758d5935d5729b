"""The threads that run the store's blocking calls for the event loop: :func:`in_store_thread`.

Each chat with memory searches the store, and the search embeds the chat's question. The
default embedder runs the questions that wait at once as one forward
(:class:`~inferscale_memory.embeddings.Coalescer`), which pays only if the chats' searches
can wait at once: the loop's default executor has ``min(32, cores + 4)`` threads (6 on a
2-core machine), so 64 chats at once reached the embedder 6 at a time (64 searches of
1,000 facts on a 2-core CPU: 489 ms through the default executor, 172 ms through these
threads; 959 ms before the embedder coalesced). The threads of :data:`STORE_THREADS` are
shared by every engine and server of the process and mostly wait: on the embedder, on
SQLite's lock or on a PostgreSQL connection of the pool.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

STORE_THREADS = 64
_threads = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="inferscale-store")
T = TypeVar("T")


async def in_store_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking store call (a search, an add, a listing) on a store thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_threads, functools.partial(func, *args, **kwargs))
