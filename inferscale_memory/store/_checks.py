"""Argument and embedder checks of the fact store.

Each argument check returns the checked value or raises
:class:`~inferscale_memory.errors.InvalidInputError` (before anything is changed).
"""

from __future__ import annotations

import copy
import json
import logging
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from inferscale_memory.errors import ConfigError, InvalidInputError, StoreError
from inferscale_memory.fields import FactCount, check, unicode_text
from inferscale_memory.store.index import normalize_rows

if TYPE_CHECKING:
    from inferscale_memory.store.sqlite import FactDB

logger = logging.getLogger(__name__)

MAX_USER_ID_CHARS = 128
MAX_METADATA_CHARS = 65536
MAX_METADATA_DEPTH = 100


def user_id(value: Any) -> str:
    """Check a user id: a non-empty str of at most 128 chars without control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"user_id must be a non-empty string; got {value!r}")
    if len(value) > MAX_USER_ID_CHARS:
        raise InvalidInputError(
            f"user_id has {len(value)} characters; at most {MAX_USER_ID_CHARS} are allowed"
        )
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidInputError(f"user_id must not contain control characters; got {value!r}")
    return unicode_text(value, "user_id")


def fact_id(value: Any) -> str:
    """Check a fact id: a str (an unknown one is reported later as not found)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"fact_id must be a string; got {type(value).__name__}")
    return unicode_text(value, "fact_id")


def text(value: Any, max_chars: int) -> str:
    """Check a fact text: a str, not blank, at most ``max_chars`` characters."""
    if not isinstance(value, str):
        raise InvalidInputError(f"a fact must be a string; got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError("a fact must not be empty or blank")
    if len(value) > max_chars:
        raise InvalidInputError(
            f"a fact has {len(value)} characters; at most {max_chars} are allowed "
            "(split it into several facts)"
        )
    return unicode_text(value, "a fact")


def text_list(value: Any) -> list[Any]:
    """Check that a batch is a sequence (not a str/bytes/dict) and return it as a list."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise InvalidInputError(
            f"facts must be a string or a sequence of strings; got {type(value).__name__}"
        )
    return list(value)


def query(value: Any) -> str:
    """Check a search query: a non-blank str."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError("the query must be a non-empty string")
    return unicode_text(value, "the query")


def positive_int(value: Any, name: str = "k") -> int:
    """Check an int >= 1 such as ``k``."""
    return int(check(FactCount, value, name))


def metadata(value: Any) -> dict[str, Any]:
    """Check metadata: a dict that survives a JSON round trip unchanged; return a copy."""
    if not isinstance(value, dict):
        raise InvalidInputError(f"metadata must be a dict; got {type(value).__name__}")
    _shallow(value)
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"metadata must be JSON-serialisable: {exc}") from exc
    unicode_text(json.dumps(value, ensure_ascii=False), "metadata")
    if len(encoded) > MAX_METADATA_CHARS:
        raise InvalidInputError(
            f"metadata is {len(encoded)} characters as JSON; at most {MAX_METADATA_CHARS}"
        )
    decoded = json.loads(encoded)
    if not _same(decoded, value):
        raise InvalidInputError(
            "metadata must hold only str keys and JSON values (str, int, float, bool, None, "
            "list, dict); tuples, sets or non-str keys would come back changed"
        )
    return copy.deepcopy(decoded)


def _shallow(value: dict[str, Any]) -> None:
    """Refuse metadata nested deeper than MAX_METADATA_DEPTH or with more than
    MAX_METADATA_CHARS values (checked without recursion and in bounded time, so that no
    depth or shared sub-structure can exhaust the stack or the CPU in the checks after)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > MAX_METADATA_CHARS:
            raise InvalidInputError(f"metadata holds more than {MAX_METADATA_CHARS} values")
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > MAX_METADATA_DEPTH:
            raise InvalidInputError(
                f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep; flatten it"
            )
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def _same(decoded: Any, original: Any) -> bool:
    """Whether ``original`` is what its JSON round trip ``decoded`` says it is.

    Unlike ``==`` this tells a list from a tuple and ``True`` from ``1``.
    """
    if isinstance(decoded, dict):
        return (
            isinstance(original, dict)
            and decoded.keys() == original.keys()
            and all(_same(decoded[key], original[key]) for key in decoded)
        )
    if isinstance(decoded, list):
        return (
            isinstance(original, list)
            and len(decoded) == len(original)
            and all(_same(x, y) for x, y in zip(decoded, original, strict=True))
        )
    if isinstance(decoded, bool) or decoded is None:
        return decoded is original
    if isinstance(original, bool):
        return False
    return isinstance(original, type(decoded)) and bool(decoded == original)


def metadata_list(value: Any, n: int, single: bool) -> list[dict[str, Any]]:
    """Expand the ``metadata`` of an add into one checked dict per fact.

    Args:
        value: ``None``, one dict (for every fact) or a sequence of ``n`` dicts.
        n: Number of facts.
        single: Whether one fact (a str) was given; then only ``None`` or a dict is allowed.
    """
    if value is None or isinstance(value, dict):
        one = {} if value is None else metadata(value)
        return [copy.deepcopy(one) for _ in range(n)]
    if single or isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidInputError(
            "metadata must be a dict, or for a batch a sequence of one dict per fact"
        )
    if len(value) != n:
        raise InvalidInputError(f"{n} facts but {len(value)} metadata dicts")
    return [metadata(m) for m in value]


class Embedder(Protocol):
    """What the store needs of an embedder."""

    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return ``(len(texts), dim)`` float32 L2-normalised embeddings."""
        ...


def embedder_dim(embedder: Any) -> int:
    """Check that ``embedder`` has an int ``dim`` >= 1 and an ``embed`` method; return dim."""
    dim = getattr(embedder, "dim", None)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise InvalidInputError(f"embedder.dim must be an int >= 1; got {dim!r}")
    if not callable(getattr(embedder, "embed", None)):
        raise InvalidInputError("embedder must have an embed(list[str]) method")
    return dim


def embed(embedder: Embedder, texts: list[str], dim: int) -> np.ndarray:
    """Embed ``texts`` and check the result: ``(len(texts), dim)`` unit float32 rows."""
    out = np.asarray(embedder.embed(texts), dtype=np.float32)
    if out.shape != (len(texts), dim):
        raise ConfigError(
            f"the embedder returned shape {out.shape} for {len(texts)} texts; "
            f"expected ({len(texts)}, {dim})"
        )
    return normalize_rows(out, dim)


def embedder_matches(db: FactDB, embedder: Any, dim: int) -> None:
    """Record the embedder in a new store, or check it against the one that wrote it.

    Raises:
        StoreError: The store holds embeddings of another dimension.
    """
    stored = db.get_meta("embedding_dim")
    name = getattr(embedder, "name", None)
    if stored is None:
        with db.transaction() as tx:
            tx.set_meta("embedding_dim", str(dim))
            if isinstance(name, str):
                tx.set_meta("embedder", name)
    elif int(stored) != dim:
        raise StoreError(
            f"{db.path} holds embeddings of dimension {stored} but the embedder gives "
            f"{dim}; open it with the embedder it was written with, or use a new file"
        )
    else:
        stored_name = db.get_meta("embedder")
        if isinstance(name, str) and stored_name is not None and stored_name != name:
            logger.warning(
                "Store %s was written with embedder %r, opened with %r", db.path, stored_name, name
            )
