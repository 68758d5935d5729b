"""API keys, each bound to the memory users it may act for.

Keys come from a JSON file or the ``INFERSCALE_API_KEYS`` environment variable, both a
JSON object mapping each key to a list of users or to ``"*"`` (every user)::

    {"sk-team-a": ["alice", "bob"], "sk-admin": "*"}

Requests send ``Authorization: Bearer <key>``: no key or an unknown one is a 401, a user
the key may not use is a 403. Without keys every request is allowed (the ``serve`` command
then binds to localhost only).
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_memory.errors import ConfigError
from inferscale_memory.server.errors import APIError

ENV_VAR = "INFERSCALE_API_KEYS"
USER_HEADER = "X-Memory-User"
ALL = "*"


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the users it may use (``None``: any, auth disabled or ``*``).

    Attributes:
        users: The users it may act for; ``None``: every user.
        authenticated: Whether it showed an API key (``False``: the server has no keys).
        key_id: Names its API key (a SHA-256 digest of it, never the key); ``""`` without
            keys: then every caller is one principal (the server binds to localhost).
    """

    users: frozenset[str] | None
    authenticated: bool = True
    key_id: str = ""

    @property
    def salt_user(self) -> str:
        """Whom a chat that names no user is salted for in vLLM's prefix cache: this
        principal's key, never a value that another key or any user id can give (user ids
        have no control characters)."""
        return f"\x00api-key:{self.key_id}"

    def allows(self, user: str) -> bool:
        """Whether this principal may read, write or chat as ``user``."""
        return self.users is None or user in self.users

    @property
    def only_user(self) -> str | None:
        """The single user of a key bound to exactly one, else ``None``."""
        if self.users is not None and len(self.users) == 1:
            return next(iter(self.users))
        return None


ANONYMOUS = Principal(None, authenticated=False)


class ApiKeys:
    """Key -> allowed users. Keys are kept as SHA-256 digests, never compared as text.

    Args:
        mapping: Key -> list of users, or ``"*"`` for every user.

    Raises:
        ConfigError: An empty key or a value that is neither ``"*"`` nor a list of
            non-empty strings.
    """

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        if not isinstance(mapping, Mapping):
            raise ConfigError("API keys must be a JSON object mapping key -> users or \"*\"")
        self._keys: dict[bytes, Principal] = {}
        for key, users in mapping.items():
            if not isinstance(key, str) or not key.strip():
                raise ConfigError("an API key must be a non-empty string")
            digest = _digest(key)
            self._keys[digest] = Principal(_users(users), key_id=digest.hex())

    def __len__(self) -> int:
        return len(self._keys)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value.

        Raises:
            APIError: 401 when the header is missing, not a Bearer token, or unknown.
        """
        if not authorization:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
        scheme, _, token = authorization.strip().partition(" ")
        principal = self._keys.get(_digest(token.strip())) if scheme.lower() == "bearer" else None
        if principal is None:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        return principal

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ApiKeys | None:
        """Keys from the JSON file ``path``, else from ``$INFERSCALE_API_KEYS``, else ``None``.

        Raises:
            ConfigError: The file is missing or either source is not valid JSON keys.
        """
        if path is not None:
            try:
                text = Path(path).read_text()
            except OSError as exc:
                raise ConfigError(f"cannot read the API key file {path}: {exc}") from exc
            source = str(path)
        elif os.environ.get(ENV_VAR):
            text, source = os.environ[ENV_VAR], f"${ENV_VAR}"
        else:
            return None
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"the API keys in {source} are not valid JSON: {exc}") from exc
        keys = cls(mapping)
        if not keys:
            raise ConfigError(f"{source} holds no API keys")
        return keys


def resolve_user(principal: Principal, explicit: str | None, header: str | None) -> str | None:
    """The user of a request, checked against what the principal may use.

    Args:
        principal: The request's principal.
        explicit: The user named in the body or query (``user`` / ``user_id``).
        header: The ``X-Memory-User`` header.

    Returns:
        The user; ``None`` when none is named and the key is not bound to exactly one.

    Raises:
        APIError: 400 when body and header disagree or the user holds a control character
            (so that no user is salted like :attr:`Principal.salt_user`), 403 when the key
            may not use it.
    """
    if explicit is not None and header is not None and explicit != header:
        raise APIError(400, f"the request names user {explicit!r} but the {USER_HEADER} "
                       f"header names {header!r}", param="user", code="user_mismatch")
    user = explicit if explicit is not None else header
    if user is None:
        return principal.only_user
    if any(unicodedata.category(c) == "Cc" for c in user):  # as the store's user ids
        raise APIError(400, f"the user {user!r} contains control characters",
                       param="user", code="invalid_value")
    if not principal.allows(user):
        raise APIError(403, f"this API key may not act for user {user!r}",
                       param="user", code="user_forbidden")
    return user


def _users(value: Any) -> frozenset[str] | None:
    if value == ALL:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(t, str) and t for t in value)):
        raise ConfigError("the users of an API key must be \"*\" or a non-empty list of "
                          "non-empty strings")
    return frozenset(value)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
