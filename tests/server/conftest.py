"""The real server (real HTTP, real engine) on 127.0.0.1, over the session's engine.

One server with API keys serves every test of this folder; tests that need another
configuration start a second one on the same engine (a uvicorn server is cheap, the
engine is not).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from server_helpers import KEYS, USER_A, USER_B, http

if TYPE_CHECKING:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import ServerHandle


@pytest.fixture(scope="session")
def server(engine: MemoryEngine) -> Iterator[ServerHandle]:
    from inferscale_memory.server import create_app, start_server

    handle = start_server(create_app(engine, KEYS, metrics_refresh_s=0), engine)
    yield handle
    handle.stop(timeout=60)


@pytest.fixture(scope="session")
def model(engine: MemoryEngine) -> str:
    return engine.model_path.name


@pytest.fixture
def fresh_users(server: ServerHandle) -> None:
    """The keyed users A and B start without facts (other tests of the session add some)."""
    with http(server) as client:
        for user in (USER_A, USER_B):
            response = client.delete("/memories", params={"user_id": user, "all": True})
            # 404: a user who never stored a fact (this test runs first)
            assert response.status_code == 200 or (
                response.status_code == 404
                and response.json()["error"]["code"] == "user_not_found"), response.text
