"""The read queries that the SQLite and the PostgreSQL fact databases answer alike.

Both hold the same tables (``facts``, ``history``, ``users``, ``meta``); they differ in
their drivers' placeholder (``?`` or ``%s``), in how a row becomes a :class:`Fact` (texts
are UTF-8 bytes in PostgreSQL) and in how a query is run, which each supplies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale_memory.store.facts import Fact


class FactQueries:
    """Reads over the four tables, for a database class that defines ``_all``."""

    MARK = "?"  # the driver's placeholder
    FACT_COLS = "id, user_id, text, metadata, created_at, updated_at"

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    @staticmethod
    def _to_fact(row: Sequence[Any]) -> Fact:
        raise NotImplementedError

    def list_user(self, user_id: str) -> list[Fact]:
        """Return a user's facts ordered by ``(created_at, id)``."""
        rows = self._all(f"SELECT {self.FACT_COLS} FROM facts WHERE user_id = {self.MARK}"
                         " ORDER BY created_at, id", (user_id,))
        return [self._to_fact(r) for r in rows]

    def users(self) -> list[str]:
        """Return every user that ever stored a fact, sorted."""
        return [r[0] for r in self._all("SELECT user_id FROM users ORDER BY user_id")]

    def counts(self) -> tuple[int, int]:
        """Return (users that ever stored a fact, facts stored now), in one query."""
        users, facts = self._all(
            "SELECT (SELECT COUNT(*) FROM users), (SELECT COUNT(*) FROM facts)")[0]
        return int(users), int(facts)

    def has_user(self, user_id: str) -> bool:
        """Whether the user ever stored a fact."""
        return bool(self._all(f"SELECT 1 FROM users WHERE user_id = {self.MARK}", (user_id,)))

    def get_meta(self, key: str) -> str | None:
        """Return one key of the ``meta`` table, or ``None``."""
        rows = self._all(f"SELECT value FROM meta WHERE key = {self.MARK}", (key,))
        return rows[0][0] if rows else None

    def last_timestamp(self) -> float:
        """Return the latest time written to the store (0.0 for an empty store)."""
        rows = self._all("SELECT MAX(at) FROM history")
        return float(rows[0][0] or 0.0)


class TxWrites:
    """Writes of one open transaction that both databases run alike, over ``_conn``."""

    MARK = "?"

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @staticmethod
    def _text_param(value: str | None) -> Any:
        """A text as the ``history`` table's columns take it."""
        return value

    def _history(self, fact: Fact, event: str, old: str | None, new: str | None, at: float) -> None:
        m = self.MARK
        self._conn.execute(
            "INSERT INTO history (fact_id, user_id, event, old_text, new_text, at)"
            f" VALUES ({m}, {m}, {m}, {m}, {m}, {m})",
            (fact.id, fact.user_id, event, self._text_param(old), self._text_param(new), at),
        )

    def delete(self, fact: Fact, at: float) -> None:
        """Delete one fact; log DELETE."""
        self._conn.execute(f"DELETE FROM facts WHERE id = {self.MARK}", (fact.id,))
        self._history(fact, "DELETE", fact.text, None, at)

    def set_meta(self, key: str, value: str) -> None:
        """Set one key of the ``meta`` table."""
        self._conn.execute(
            f"INSERT INTO meta (key, value) VALUES ({self.MARK}, {self.MARK})"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )
