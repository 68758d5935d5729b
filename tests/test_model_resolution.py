"""A hub model id is looked up in the local Hugging Face cache first; one that is not there
fails at once, typed, when the hub is offline or unreachable. No test touches the network:
"offline" is HF_HUB_OFFLINE=1 with an empty cache of the test's own, "the hub" is a fake
one on localhost."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inferscale_memory.errors import PREPARE_COMMAND, ModelPreparationError
from inferscale_memory.models import resolve_model

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache of this test alone, with the hub offline."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home / "hub"


def cache_snapshot(cache: Path, repo_id: str, files: tuple[str, ...]) -> Path:
    """Write ``files`` as the ``main`` snapshot of ``repo_id`` in huggingface_hub's layout
    (``models--org--name/refs/main`` naming ``snapshots/<revision>``)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for name in files:
        (snapshot / name).write_text("{}")
    return snapshot


def test_a_cached_hub_id_resolves_offline_to_its_snapshot(hub_cache: Path,
                                                          tmp_path: Path) -> None:
    snapshot = cache_snapshot(hub_cache, MODEL_ID,
                              ("config.json", "model.safetensors", "tokenizer.json"))
    assert resolve_model(MODEL_ID, tmp_path / "cache") == snapshot.resolve()
    assert not (tmp_path / "cache").exists()


def test_an_uncached_hub_id_offline_is_a_typed_error_naming_the_fixes(
        hub_cache: Path, tmp_path: Path, fake_hub: FakeHub) -> None:
    with pytest.raises(ModelPreparationError) as raised:
        resolve_model(MODEL_ID, tmp_path / "cache")
    message = str(raised.value)
    assert "\n" not in message
    assert MODEL_ID in message and str(hub_cache) in message
    assert "HF_HUB_OFFLINE" in message
    assert "local model folder" in message
    assert f"`{PREPARE_COMMAND}`" in message
    assert fake_hub.requests == []  # offline: not one attempt


def test_a_hub_id_cached_without_weights_is_not_in_the_cache(hub_cache: Path,
                                                             tmp_path: Path) -> None:
    """A tokenizer loaded once caches config.json too: vLLM could not start from that."""
    cache_snapshot(hub_cache, MODEL_ID, ("config.json", "tokenizer.json"))
    with pytest.raises(ModelPreparationError, match="HF_HUB_OFFLINE"):
        resolve_model(MODEL_ID, tmp_path / "cache")


# -- online: the hub is asked once, briefly, only for an id that is not in the cache ------


class FakeHub:
    """A Hugging Face hub on localhost that answers every request with ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub.requests.append(self.path)
                body = (f'{{"id": "{MODEL_ID}"}}' if hub.status == 200
                        else '{"error": "no"}').encode()
                self.send_response(hub.status)
                self.send_header("Content-Type", "application/json")
                if hub.status == 404:  # what the real hub says of an id it does not know
                    self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def fake_hub(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[FakeHub]:
    """The hub that ``HF_ENDPOINT`` names: answers 200, or the status the test passes
    (``indirect`` parametrization)."""
    hub = FakeHub(getattr(request, "param", 200))
    thread = threading.Thread(target=hub.server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    yield hub
    hub.server.shutdown()
    hub.server.server_close()


@pytest.fixture
def online(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's empty cache, with offline mode off (also where the run set it before
    huggingface_hub was imported)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return hub_cache


@pytest.mark.usefixtures("online")
def test_an_uncached_hub_id_on_a_reachable_hub_is_left_to_vllm(tmp_path: Path,
                                                               fake_hub: FakeHub) -> None:
    assert resolve_model(MODEL_ID, tmp_path / "cache") == Path(MODEL_ID)
    assert fake_hub.requests == [f"/api/models/{MODEL_ID}"]
    assert not (tmp_path / "cache").exists()


@pytest.mark.usefixtures("online")
def test_a_cached_hub_id_online_does_not_ask_the_hub(hub_cache: Path, tmp_path: Path,
                                                     fake_hub: FakeHub) -> None:
    snapshot = cache_snapshot(hub_cache, MODEL_ID, ("config.json", "model.safetensors"))
    assert resolve_model(MODEL_ID, tmp_path / "cache") == snapshot.resolve()
    assert fake_hub.requests == []


@pytest.mark.usefixtures("online")
def test_an_unreachable_hub_is_one_attempt_and_a_typed_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:  # a port nothing listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(ModelPreparationError, match="unreachable") as raised:
        resolve_model(MODEL_ID, tmp_path / "cache")
    message = str(raised.value)
    assert "\n" not in message
    assert "HF_HUB_OFFLINE" in message and f"`{PREPARE_COMMAND}`" in message


@pytest.mark.usefixtures("online")
@pytest.mark.parametrize("fake_hub", [503], indirect=True)
def test_a_failing_hub_is_asked_once(tmp_path: Path, fake_hub: FakeHub) -> None:
    """No retries: a hub that answers 503 is an error now, not after a minute of backoff."""
    with pytest.raises(ModelPreparationError, match="unreachable"):
        resolve_model(MODEL_ID, tmp_path / "cache")
    assert len(fake_hub.requests) == 1


@pytest.mark.usefixtures("online")
@pytest.mark.parametrize("fake_hub", [404], indirect=True)
def test_an_id_the_hub_does_not_know_is_a_typed_error(tmp_path: Path,
                                                      fake_hub: FakeHub) -> None:
    with pytest.raises(ModelPreparationError, match="no model 'inferscale-tests/nope' on"):
        resolve_model("inferscale-tests/nope", tmp_path / "cache")
    assert len(fake_hub.requests) == 1


def test_the_engine_is_named_after_the_hub_id_not_the_snapshot(tmp_path: Path) -> None:
    """A cached hub id resolves to a snapshot folder named after a revision hash; the
    server's model name, the adapters' and the bench's keep the id the user gave."""
    from inferscale_memory import MemoryConfig, MemoryEngine

    engine = MemoryEngine.__new__(MemoryEngine)  # the names only: no engine starts
    engine._config = MemoryConfig(model="org/tiny-chat")
    engine.model_path = tmp_path / "models--org--tiny-chat" / "snapshots" / ("a" * 40)
    assert engine.model_name == "org/tiny-chat"
    folder = tmp_path / "My-Model"
    folder.mkdir()
    engine._config = MemoryConfig(model=str(folder))
    engine.model_path = folder
    assert engine.model_name == "My-Model"
