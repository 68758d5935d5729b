"""A request for one fact never reaches "delete all" (real server, real clients).

``DELETE /v1/memories/`` (an empty fact id, or ``.`` that clients normalise away) was
redirected to the delete-all route, and ``requests`` and ``httpx`` follow redirects: a
client deleting one fact wiped the user's memory. Now no route redirects, and delete-all
has one explicit form: ``DELETE /v1/memories?user_id=...&all=true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import requests
from server_helpers import add_facts, assert_openai_error, http

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine
AUTH = {"Authorization": "Bearer key-admin"}


def remaining(server: ServerHandle, user: str) -> int:
    with http(server) as client:
        return len(client.get("/memories", params={"user_id": user}).json()["data"])


PATHS = ["/v1/memories/", "/v1/memories/.", "/v1/memories//"]


@pytest.mark.parametrize("client", ["requests", "httpx"])
@pytest.mark.parametrize("path", PATHS)
def test_deleting_an_empty_fact_id_deletes_nothing(server: ServerHandle, client: str,
                                                   path: str) -> None:
    user = f"srv-delete-{client}-{PATHS.index(path)}"
    add_facts(server, user, ["Keep this fact.", "Keep this one too."])
    params = {"user_id": user}
    if client == "requests":
        response = requests.delete(server.url + path, params=params, headers=AUTH, timeout=60)
        status = response.status_code
    else:
        status = httpx.delete(server.url + path, params=params, headers=AUTH, timeout=60,
                              follow_redirects=True).status_code
    # 404: no such route (no redirect to another one); 400: a client that normalised the
    # path down to "/v1/memories" reached delete-all without its explicit all=true
    assert status in (400, 404)
    assert remaining(server, user) == 2


def test_delete_all_needs_its_explicit_form(server: ServerHandle) -> None:
    user = "srv-delete-all"
    add_facts(server, user, ["One fact.", "Another fact."])
    with http(server) as client:
        response = client.delete("/memories", params={"user_id": user})
        assert_openai_error(response, 400)
        assert "all=true" in response.json()["error"]["message"]
        assert remaining(server, user) == 2
        wiped = client.delete("/memories", params={"user_id": user, "all": "true"})
    assert wiped.status_code == 200 and wiped.json()["deleted"] == 2
    assert remaining(server, user) == 0
