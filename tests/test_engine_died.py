"""An engine whose vLLM engine core died (killed here, as the OOM killer or a crash would
end it) fails every call that needs vLLM with :class:`EngineDiedError`, vLLM's
``EngineDeadError`` chained, at once; the server answers 503 ``engine_unavailable`` with
one log line and no traceback (issue 30). Before, vLLM's own ``EngineDeadError`` reached
the caller, and the server logged its traceback.

One engine of its own on the tiny model (seconds to start), killed once: first while the
server streams an answer, then every face is called on the dead engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest
from serve_process import alive

from inferscale_memory import EngineDiedError, EngineError

if TYPE_CHECKING:
    from inferscale_memory import Fact, MemoryEngine
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine

USER = "died-dora"
QUESTION = [{"role": "user", "content": "Where does Dora keep her bees?"}]


class Recorded(logging.Handler):
    """The library's log records at ERROR and above, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Dead:
    engine: MemoryEngine
    server: ServerHandle
    fact: Fact
    cut_stream: list[str]  # the SSE lines of a stream that the kill cut, after the kill
    logged: Recorded = field(default_factory=Recorded)  # the library's errors since the kill


@pytest.fixture(scope="module")
def dead(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dead]:
    from inferscale_memory import MemoryEngine
    from inferscale_memory.server import create_app, start_server

    own = psutil.Process()
    before = {p.pid for p in own.children(recursive=True)}
    store = tmp_path_factory.mktemp("died") / "memory.sqlite"
    engine = MemoryEngine(str(tiny_model), store_path=str(store), kv_cache_gb=1,
                          max_model_len=2048, recompute_tail=0, capture_context=0,
                          enforce_eager=True)
    processes = [p for p in own.children(recursive=True) if p.pid not in before]
    server = start_server(create_app(engine), engine)
    logged = Recorded()
    library = logging.getLogger("inferscale_memory")
    try:
        fact = engine.memory.add("Dora keeps her bees on a roof in Lyon.", user_id=USER)
        library.addHandler(logged)
        cut = stream_cut_by_kill(server, engine.model_name, engine_core(processes))
        yield Dead(engine, server, fact, cut, logged)
    finally:
        library.removeHandler(logged)
        server.stop(timeout=30)
        engine.close()
        for process in processes:  # this engine's own, should any outlive its core
            if alive(process):
                process.kill()


def engine_core(processes: list[psutil.Process]) -> psutil.Process:
    """vLLM's engine core among an engine's processes: the one this process started that
    names itself so (its worker and multiprocessing's resource tracker are the others)."""
    [core] = [p for p in processes
              if p.ppid() == psutil.Process().pid and "EngineCore" in p.name()]
    return core


def stream_cut_by_kill(server: ServerHandle, model: str, core: psutil.Process
                       ) -> list[str]:
    """Stream a long answer through the server, kill the engine core after its first
    piece of text, and return the stream's lines from then on."""
    body = {"model": model, "messages": QUESTION, "stream": True, "max_tokens": 1800,
            "ignore_eos": True}
    with httpx.Client(base_url=f"{server.url}/v1", timeout=120) as client, \
            client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: ") and '"content":"' in line.replace(" ", "") \
                    and '"content":""' not in line.replace(" ", ""):
                break
        core.kill()
        return [line for line in lines if line]


def raised_by(call: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as failed:
        call()
    return failed.value


async def drain(chunks: AsyncIterator[Any]) -> None:
    async for _ in chunks:
        pass


FACES: dict[str, Callable[[MemoryEngine, Fact], Any]] = {
    "chat": lambda e, f: e.chat(QUESTION, user_id=USER, max_tokens=2),
    "achat": lambda e, f: asyncio.run(e.achat(QUESTION, user_id=USER, max_tokens=2)),
    "stream_chat": lambda e, f: list(e.stream_chat(QUESTION, user_id=USER, max_tokens=2)),
    "astream_chat": lambda e, f: asyncio.run(
        drain(e.astream_chat(QUESTION, user_id=USER, max_tokens=2))),
    "answer": lambda e, f: e.answer(QUESTION, [f], user_id=USER, max_tokens=2),
    "text mode": lambda e, f: e.chat(QUESTION, user_id=USER, mode="text", max_tokens=2),
    "capture (warm)": lambda e, f: e.warm(USER),
    "evict (drop_kv)": lambda e, f: e.drop_kv(USER, [f.id]),
    "reset_prefix_cache": lambda e, f: e.reset_prefix_cache(),
}


@pytest.mark.parametrize("face", FACES)
def test_every_call_to_a_dead_engine_raises_engine_died_error(dead: Dead, face: str) -> None:
    error = raised_by(lambda: FACES[face](dead.engine, dead.fact))
    assert isinstance(error, EngineDiedError) and isinstance(error, EngineError), repr(error)
    assert type(error.__cause__).__name__ == "EngineDeadError"  # vLLM's, chained
    assert "start a new MemoryEngine" in str(error)
    assert not dead.engine.healthy


def test_a_stream_cut_by_the_death_ends_with_an_engine_unavailable_event(dead: Dead) -> None:
    """The server had sent 200 and some text: the error is the stream's last event, and
    the server logs it in one line, without a traceback."""
    events = [json.loads(line[6:]) for line in dead.cut_stream if line != "data: [DONE]"]
    assert "data: [DONE]" not in dead.cut_stream
    assert events[-1]["error"]["code"] == "engine_unavailable", events[-1]
    assert "start a new MemoryEngine" in events[-1]["error"]["message"]
    assert_one_line_each(dead.logged.records, 1)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_chat_to_a_dead_engine_is_503_engine_unavailable(dead: Dead, stream: bool) -> None:
    logged = Recorded()
    library = logging.getLogger("inferscale_memory")
    library.addHandler(logged)
    try:
        with httpx.Client(base_url=f"{dead.server.url}/v1", timeout=60) as client:
            response = client.post("/chat/completions", json={
                "model": dead.engine.model_name, "messages": QUESTION, "stream": stream,
                "max_tokens": 2})
            health = client.get(f"{dead.server.url}/health")
    finally:
        library.removeHandler(logged)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "engine_unavailable" and error["type"] == "server_error"
    assert "start a new MemoryEngine" in error["message"]
    assert health.status_code == 503
    assert_one_line_each(logged.records, 1)


def assert_one_line_each(records: list[logging.LogRecord], requests: int) -> None:
    """``requests`` failures logged, each in one line: no traceback, vLLM's included."""
    assert len(records) == requests, [r.getMessage() for r in records]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records), \
        [r.getMessage() for r in records]


def test_deleting_facts_on_a_dead_engine_deletes_them(dead: Dead) -> None:
    """A delete whose KV eviction finds the engine core dead is whole: the KV died with it
    (a new engine starts with an empty pool), so the delete succeeds instead of raising
    after the store had deleted the fact, which left a retry with FactNotFoundError."""
    from inferscale_memory import FactNotFoundError

    one, two, three = dead.engine.store.add(
        ["Dora's hives face south.", "Dora sells honey on Saturdays.", "Dora has 9 hives."],
        user_id="died-dora-delete")
    assert dead.engine.memory.delete(one.id, user_id="died-dora-delete").id == one.id
    assert dead.engine.memory.delete_all(user_id="died-dora-delete") == 2
    for fact in (one, two, three):
        with pytest.raises(FactNotFoundError):
            dead.engine.memory.get(fact.id, user_id="died-dora-delete")
