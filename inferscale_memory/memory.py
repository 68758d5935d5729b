"""The fact API of a :class:`~inferscale_memory.MemoryEngine`: the store plus fact KV.

Every write goes to the durable store first (the fact is the truth, KV is a cache), then
to the engine's :class:`~inferscale_memory.fact_kv.FactKV`: ``add`` captures the fact's
KV, ``update`` recaptures it, ``delete`` and ``delete_all`` evict it. The capture context
(which of the user's facts precede a fact in its capture prompt) is read here, from the
store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from inferscale_memory.errors import EngineClosedError, InvalidInputError, StoreError
from inferscale_memory.layout import prompt_contexts
from inferscale_memory.store import Fact, MemoryStore, ScoredFact
from inferscale_memory.store.threads import in_store_thread

if TYPE_CHECKING:
    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.fact_kv import FactKV

logger = logging.getLogger(__name__)

MAX_RECAPTURING = 256  # facts whose background recapture may be under way at once


class EngineMemory:
    """Mem0-style fact operations whose KV lives in the engine.

    ``config`` is the engine's (:attr:`MemoryEngine.config` keeps it current): its
    ``capture_context`` and ``max_fact_tokens`` are read at each call. Once the engine
    is closed (:meth:`close`), every call raises
    :class:`~inferscale_memory.EngineClosedError`, reads included.
    """

    def __init__(self, store: MemoryStore, fact_kv: FactKV, config: MemoryConfig) -> None:
        self.store = store
        self.fact_kv = fact_kv
        self.config = config
        self._closed = False
        self._recapturing: set[tuple[str, str]] = set()  # (user, fact id) under way

    def close(self) -> None:
        """Refuse every later call: the engine closes the store next (called by
        :meth:`MemoryEngine.close`)."""
        self._closed = True

    @overload
    def add(self, text: str, *, user_id: str, metadata: dict[str, Any] | None = None) -> Fact: ...
    @overload
    def add(self, text: Sequence[str], *, user_id: str,
            metadata: Sequence[dict[str, Any]] | None = None) -> list[Fact]: ...

    def add(self, text: Any, *, user_id: str, metadata: Any = None) -> Any:
        """Store one fact (or a list) for ``user_id`` and capture its KV.

        Example:
            >>> engine.memory.add("Caroline moved to Berlin.", user_id="caroline")  # doctest: +SKIP
        """
        return self.fact_kv.runtime.run(self._aadd(text, user_id=user_id, metadata=metadata))

    def get(self, fact_id: str, *, user_id: str) -> Fact:
        return self._read(self.store.get, fact_id, user_id=user_id)

    def list(self, *, user_id: str) -> list[Fact]:
        return self._read(self.store.list, user_id=user_id)

    def search(self, query: str, *, user_id: str, k: int = 10) -> list[ScoredFact]:
        return self._read(self.store.search, query, user_id=user_id, k=k)

    def history(self, fact_id: str, *, user_id: str) -> list[dict[str, Any]]:
        return self._read(self.store.history, fact_id, user_id=user_id)

    def update(self, fact_id: str, text: str, *, user_id: str,
               metadata: dict[str, Any] | None = None) -> Fact:
        """Change a fact's text; its KV is recaptured."""
        return self.fact_kv.runtime.run(
            self._aupdate(fact_id, text, user_id=user_id, metadata=metadata))

    def delete(self, fact_id: str, *, user_id: str) -> Fact:
        """Delete a fact; its KV is evicted from the engine."""
        return self.fact_kv.runtime.run(self._adelete(fact_id, user_id=user_id))

    def delete_all(self, *, user_id: str) -> int:
        """Delete every fact of ``user_id``; their KV is evicted."""
        return self.fact_kv.runtime.run(self._adelete_all(user_id=user_id))

    # -- async variants: awaitable from any event loop ------------------------------------

    async def aadd(self, text: Any, *, user_id: str, metadata: Any = None) -> Any:
        """Async :meth:`add`."""
        return await self._call(self._aadd(text, user_id=user_id, metadata=metadata))

    async def aupdate(self, fact_id: str, text: str, *, user_id: str,
                      metadata: dict[str, Any] | None = None) -> Fact:
        """Async :meth:`update`."""
        return await self._call(self._aupdate(fact_id, text, user_id=user_id,
                                              metadata=metadata))

    async def adelete(self, fact_id: str, *, user_id: str) -> Fact:
        """Async :meth:`delete`."""
        return await self._call(self._adelete(fact_id, user_id=user_id))

    async def adelete_all(self, *, user_id: str) -> int:
        """Async :meth:`delete_all`."""
        return await self._call(self._adelete_all(user_id=user_id))

    async def asearch(self, query: str, *, user_id: str, k: int = 10) -> list[ScoredFact]:
        """Async :meth:`search` (the embedding runs in a worker thread)."""
        return await self._call(self._asearch(query, user_id=user_id, k=k))

    async def _call(self, coro: Any) -> Any:
        return await self.fact_kv.runtime.call(coro)

    def _read(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """A read of the store, which the engine's close also closes: then (or if the close
        lands during the read) the engine's error, not the store's, which would point the
        caller to a new MemoryStore instead of a new MemoryEngine."""
        self._check_open()
        try:
            return func(*args, **kwargs)
        except StoreError:
            self._check_open()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; start a new MemoryEngine")

    # -- the same on the engine loop --------------------------------------------------------

    async def _aadd(self, text: Any, *, user_id: str, metadata: Any = None) -> Any:
        texts = [text] if isinstance(text, str) else self.store.check_texts(text)
        for item in texts:
            self._check_tokens(item)
        added = await in_store_thread(self.store.add, text, user_id=user_id, metadata=metadata)
        await self._capture_stored(user_id, [added] if isinstance(added, Fact) else added)
        return added

    async def _aupdate(self, fact_id: str, text: str, *, user_id: str,
                       metadata: dict[str, Any] | None = None) -> Fact:
        self._check_tokens(text)
        fact = await in_store_thread(self.store.update, fact_id, text, user_id=user_id,
                                     metadata=metadata)
        await self._capture_stored(user_id, [fact])
        return fact

    async def _adelete(self, fact_id: str, *, user_id: str) -> Fact:
        fact = await in_store_thread(self.store.delete, fact_id, user_id=user_id)
        await self.fact_kv.evict_deleted(user_id, [fact.id])
        return fact

    async def _adelete_all(self, *, user_id: str) -> int:
        facts = await in_store_thread(self.store.list, user_id=user_id)
        count = await in_store_thread(self.store.delete_all, user_id=user_id)
        await self.fact_kv.evict_deleted(user_id, [fact.id for fact in facts])
        return count

    async def _asearch(self, query: str, *, user_id: str, k: int = 10) -> list[ScoredFact]:
        return await in_store_thread(self.store.search, query, user_id=user_id, k=k)

    # -- fact KV ------------------------------------------------------------------------

    async def capture(self, user_id: str, facts: Sequence[Fact]) -> None:
        """Have the engine compute and keep the KV of ``facts`` of ``user_id``, each after
        its capture context read from the store (:meth:`contexts`)."""
        await self.fact_kv.capture(user_id, facts, await self.contexts(user_id, facts))

    async def recapture(self, user_id: str, prompt: Sequence[Fact], missing: set[str]) -> None:
        """Capture the facts of a prompt whose KV was missing. Their capture context is
        read from the store when it holds the user, as at ``add``; facts handed in from
        another store (e.g. Mem0's) take the facts before them in this prompt.

        Answers that miss the same fact at once recapture it once: a fact whose recapture
        is under way is left out, and so is every fact past :data:`MAX_RECAPTURING` under
        way (a burst of answers after a restart, say, would otherwise queue captures
        without bound ahead of the answers); the next answer that misses it asks again.
        """
        wanted = []
        for fact in prompt:
            key = (user_id, fact.id)
            if fact.id in missing and key not in self._recapturing \
                    and len(self._recapturing) < MAX_RECAPTURING:
                self._recapturing.add(key)
                wanted.append(fact)
        if len(wanted) < len(missing):
            logger.debug("recapturing %d of %d missing fact(s) of %r (the rest are under "
                         "way or over the limit)", len(wanted), len(missing), user_id)
        if not wanted:
            return
        try:
            if await in_store_thread(self.store.has_user, user_id):
                await self.capture(user_id, wanted)
            else:
                await self.fact_kv.capture(
                    user_id, wanted, prompt_contexts(prompt, wanted, self.config.capture_context))
        finally:
            self._recapturing.difference_update((user_id, fact.id) for fact in wanted)

    async def _capture_stored(self, user_id: str, facts: Sequence[Fact]) -> None:
        """Capture facts the store has committed. A failure is logged, not raised: the
        facts are stored (an error would have the caller retry and store them twice), and
        the first answer that needs one computes it from its text and recaptures it."""
        try:
            await self.capture(user_id, facts)
        except Exception as exc:  # noqa: BLE001 - any engine failure; the facts are kept
            logger.warning("%d fact(s) of %r stored, but their KV capture failed (%s); "
                           "an answer that needs them computes them from their text",
                           len(facts), user_id, exc)

    async def contexts(self, user_id: str, facts: Sequence[Fact]
                       ) -> dict[str, tuple[str, ...]]:
        """Per fact id, the texts of the facts that precede it in its capture prompt:
        ``config.capture_context`` of the user's other facts most similar to it, in
        ``config.capture_context_order`` (:meth:`MemoryStore.neighbours`: by the facts'
        stored embeddings, reading no more than the hits); ``{}`` when context capture is
        off."""
        count = self.config.capture_context
        if count == 0 or not facts:
            return {}
        near = await in_store_thread(self.store.neighbours, facts, user_id=user_id, k=count,
                                     order=self.config.capture_context_order)
        return {fact.id: tuple(f.text for f in before)
                for fact, before in zip(facts, near, strict=True)}

    def _check_tokens(self, text: Any) -> None:
        text = self.store.check_text(text)  # type, blank, size, Unicode: before tokenizing
        limit = self.config.max_fact_tokens
        count = len(self.fact_kv.builder.fact_ids(text))
        if count > limit:
            raise InvalidInputError(
                f"the fact has {count} tokens; at most {limit} are allowed "
                "(split it, or raise max_fact_tokens)")
