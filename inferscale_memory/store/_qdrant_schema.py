"""The Qdrant collection behind :class:`~inferscale_memory.store.qdrant.QdrantIndex`.

One collection holds every user, one point per fact. The point id is a UUID5 of (user id,
fact id); the payload holds the user id (a keyword field, indexed with Qdrant's
``is_tenant``), the fact id and a digest of the vector. This module imports qdrant-client,
makes point ids, payloads and digests, and creates or checks the collection. It holds no
lock: the index calls it under its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import Any

import numpy as np

from inferscale_memory.errors import ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)

INSTALL = "pip install 'inferscale-memory[qdrant]'"
USER_KEY = "tenant"  # the payload field of the user id (its name in stored collections)
FACT_KEY = "fact_id"
DIGEST_KEY = "digest"
_POINT_NAMESPACE = uuid.UUID("4f2c0a8e-6d1b-5c3e-9a7f-1b2d3c4e5f60")


def import_qdrant() -> Any:
    """The ``qdrant_client`` module, or :class:`MissingDependencyError` naming the extra."""
    try:
        import qdrant_client
    except ImportError as exc:
        raise MissingDependencyError(
            f"the Qdrant index needs qdrant-client: {INSTALL} (or set index='exact')"
        ) from exc
    return qdrant_client


def point_id(user_id: str, fact_id: str) -> str:
    """The Qdrant point id of one fact of one user: a UUID5, the same on every machine."""
    return str(uuid.uuid5(_POINT_NAMESPACE, json.dumps([user_id, fact_id])))


def vector_digest(vector: np.ndarray) -> str:
    """A digest of a normalised float32 vector, to tell at load whether a point is current."""
    return hashlib.blake2b(vector.tobytes(), digest_size=16).hexdigest()


def payload(user_id: str, fact_id: str, vector: np.ndarray) -> dict[str, str]:
    """The payload of one fact's point."""
    return {USER_KEY: user_id, FACT_KEY: fact_id, DIGEST_KEY: vector_digest(vector)}


def open_collection(client: Any, name: str, dim: int | None, remote: bool) -> int | None:
    """Check the collection if it exists, else create it if ``dim`` is known.

    Returns:
        The collection's vector size, or ``None`` when it does not exist (yet).

    Raises:
        ConfigError: The collection does not hold single cosine vectors of size ``dim``.
    """
    if client.collection_exists(name):
        return check_collection(client, name, dim, remote)
    return None if dim is None else create_collection(client, name, dim, remote)


def check_collection(client: Any, name: str, dim: int | None, remote: bool) -> int:
    """Check an existing collection's vectors; returns their size (see :func:`open_collection`)."""
    from qdrant_client import models

    info = client.get_collection(name)
    vectors = info.config.params.vectors
    if not isinstance(vectors, models.VectorParams) or vectors.distance != models.Distance.COSINE:
        raise ConfigError(f"Qdrant collection {name!r} does not hold single cosine vectors; "
                          "choose another qdrant_collection")
    if dim is not None and vectors.size != dim:
        raise ConfigError(f"Qdrant collection {name!r} holds vectors of size {vectors.size}, "
                          f"the embedder gives {dim}; choose another qdrant_collection")
    if remote and USER_KEY not in info.payload_schema:
        _create_user_index(client, name)  # a collection made elsewhere may lack it
    return int(vectors.size)


def create_collection(client: Any, name: str, dim: int, remote: bool) -> int:
    """Create the collection (or check it, if another process just did); returns ``dim``."""
    from qdrant_client import models

    try:
        # m=0 with payload_m: no global graph, one HNSW graph per user, which is
        # Qdrant's advice when every search filters on the user (as ours do).
        client.create_collection(
            name, vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE),
            hnsw_config=models.HnswConfigDiff(payload_m=16, m=0))
    except Exception:
        if not client.collection_exists(name):  # not a lost race
            raise
        return check_collection(client, name, dim, remote)
    if remote:  # local mode has no payload indexes (and warns about them)
        _create_user_index(client, name)
    logger.info("Created Qdrant collection %r (dim %d)", name, dim)
    return dim


def _create_user_index(client: Any, name: str) -> None:
    from qdrant_client import models

    client.create_payload_index(name, USER_KEY, field_schema=models.KeywordIndexParams(
        type=models.KeywordIndexType.KEYWORD, is_tenant=True))
