"""``inferscale-memory demo``: three users' facts, questions, KV path beside text path,
then TTFT over ``k`` (facts retrieved per question)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from statistics import median

from inferscale_memory.engine import MemoryEngine
from inferscale_memory.results import ChatMetrics

FACTS = {
    "caroline": [
        "Caroline moved to Berlin in May 2023.",
        "Caroline works as a nurse at a children's hospital.",
        "Caroline has a golden retriever called Biscuit.",
        "Caroline is learning to play the cello.",
        "Caroline's favourite food is ramen.",
        "Caroline's brother Tom lives in Dublin.",
        "Caroline goes swimming every Tuesday morning.",
        "Caroline is reading a novel about a lighthouse keeper.",
        "Caroline cycles to work on an old green bicycle.",
        "Caroline visited Japan in spring 2022.",
        "Caroline grew up in Leeds.",
        "Caroline's mother is a retired pharmacist.",
        "Caroline works night shifts twice a month.",
        "Caroline is vegetarian since 2019.",
        "Caroline's birthday is on 14 March.",
        "Caroline takes German lessons on Thursday evenings.",
        "Caroline shares her flat with a friend called Ines.",
        "Caroline dislikes horror films.",
        "Caroline volunteers at an animal shelter on Sundays.",
        "Caroline wants to run a half marathon next year.",
        "Caroline studied nursing at the University of Manchester.",
        "Caroline drinks oat milk in her coffee.",
        "Caroline keeps a vegetable plot in a community garden.",
        "Caroline is saving money for a trip to Iceland.",
        "Caroline's favourite band is Fleetwood Mac.",
        "Caroline broke her wrist skiing in 2020.",
        "Caroline bakes sourdough bread every weekend.",
        "Caroline's best friend Priya is a doctor in London.",
        "Caroline collects postcards from every city she visits.",
        "Caroline's landlord is raising the rent in January.",
        "Caroline plays volleyball in a league on Wednesdays.",
        "Caroline is afraid of heights.",
        "Caroline's dog Biscuit is five years old.",
        "Caroline prefers trains to planes for short trips.",
        "Caroline listens to podcasts about history.",
        "Caroline has two tattoos, a fern and a swallow.",
        "Caroline wears glasses for reading.",
        "Caroline's favourite season is autumn.",
        "Caroline is knitting a scarf for her brother.",
        "Caroline wants to adopt a second dog.",
    ],
    "melanie": [
        "Melanie lives in Lisbon with her two kids.",
        "Melanie paints landscapes on weekends.",
        "Melanie is allergic to peanuts.",
        "Melanie ran her first marathon in Porto in October 2022.",
        "Melanie teaches maths at a secondary school.",
        "Melanie's daughter is called Sofia.",
        "Melanie plays the guitar in a small band.",
        "Melanie grows basil and mint in her kitchen window.",
        "Melanie has never been to Asia.",
        "Melanie prefers tea to coffee.",
        "Melanie's son Rui is eight years old.",
        "Melanie was born in Lyon.",
        "Melanie speaks French, Portuguese and English.",
        "Melanie's husband Joao is an architect.",
        "Melanie drives a blue electric car.",
        "Melanie goes surfing in Ericeira in the summer.",
        "Melanie is writing a children's book about a lost cat.",
        "Melanie hates loud restaurants.",
        "Melanie's favourite painter is Joaquin Sorolla.",
        "Melanie coaches the school's chess club.",
        "Melanie had knee surgery in 2021.",
        "Melanie bakes custard tarts for her neighbours.",
        "Melanie's sister Claire lives in Montreal.",
        "Melanie wakes up at six every morning.",
        "Melanie keeps two rabbits called Salt and Pepper.",
        "Melanie does yoga on Monday and Friday evenings.",
        "Melanie's band plays covers of The Beatles.",
        "Melanie is saving for a house with a garden.",
        "Melanie reads crime novels before bed.",
        "Melanie's favourite dish is grilled sardines.",
        "Melanie avoids flying when she can.",
        "Melanie takes the tram to school.",
        "Melanie's parents visit every Christmas.",
        "Melanie is learning to sail.",
        "Melanie's birthday is on 2 August.",
        "Melanie won a regional painting prize in 2019.",
        "Melanie volunteers at a food bank once a month.",
        "Melanie wants to visit Morocco next spring.",
        "Melanie's daughter Sofia plays the violin.",
        "Melanie is lactose intolerant.",
    ],
    "omar": [
        "Omar is a software engineer who writes compilers.",
        "Omar grows tomatoes on his balcony.",
        "Omar's sister is called Leila.",
        "Omar drinks his coffee black.",
        "Omar plays chess online every evening.",
        "Omar lives in Toronto.",
        "Omar is training for a half marathon.",
        "Omar collects vinyl records of jazz.",
        "Omar speaks Arabic, English and French.",
        "Omar adopted a grey cat named Pixel.",
        "Omar was born in Cairo.",
        "Omar moved to Canada in 2016.",
        "Omar works remotely for a company in Montreal.",
        "Omar's partner Sam is a nurse.",
        "Omar is allergic to cats' fur but keeps Pixel anyway.",
        "Omar cooks lentil soup every Sunday.",
        "Omar plays the oud.",
        "Omar's favourite author is Naguib Mahfouz.",
        "Omar climbs at an indoor gym twice a week.",
        "Omar is learning Japanese.",
        "Omar's father owns a bookshop in Alexandria.",
        "Omar does not drink alcohol.",
        "Omar commutes by subway when he goes to the office.",
        "Omar's birthday is on 9 November.",
        "Omar is building a mechanical keyboard.",
        "Omar went to Iceland for his honeymoon.",
        "Omar watches every Toronto Raptors game.",
        "Omar is afraid of deep water.",
        "Omar's best friend Yusuf lives in Berlin.",
        "Omar bakes bread when he cannot sleep.",
        "Omar has a degree in physics.",
        "Omar mentors students at a coding club.",
        "Omar wants to open a small cafe one day.",
        "Omar sleeps badly in hot weather.",
        "Omar's nephew Karim is three years old.",
        "Omar buys his vegetables at the St. Lawrence Market.",
        "Omar runs along the lake shore before work.",
        "Omar uses a standing desk.",
        "Omar's favourite film is Lawrence of Arabia.",
        "Omar plans to visit his family in Egypt in December.",
    ],
}

QUESTIONS = [
    ("caroline", "Where does Caroline live?"),
    ("caroline", "What is the name of Caroline's dog?"),
    ("melanie", "What is Melanie allergic to?"),
    ("omar", "What does Omar grow on his balcony?"),
]

# Other questions than the ones answered above, asked once per k and path for the table.
TIMED_QUESTIONS = [
    ("caroline", "Which instrument is Caroline learning?"),
    ("melanie", "What is the name of Melanie's son?"),
    ("omar", "What is Omar's cat called?"),
    ("caroline", "What does Caroline bake every weekend?"),
    ("melanie", "Where did Melanie run her first marathon?"),
]
TABLE_KS = (5, 10, 20, 40)


def run_demo(model: str | None = None, k: int = 10) -> None:
    """Start the engine, add the facts, answer each question on both paths with ``k``
    facts, then time both paths over :data:`TABLE_KS`.

    The KV path follows the default answer-quality policy: the facts' KV is injected,
    except the last ``recompute_tail`` facts (those nearest the question), which vLLM
    computes; when that would leave one fact or none to inject, every fact is computed.
    """
    with tempfile.TemporaryDirectory() as tmp:
        store_path = str(Path(tmp) / "demo.sqlite")
        with MemoryEngine(model, store_path=store_path) as engine:
            for user_id, facts in FACTS.items():
                engine.memory.add(facts, user_id=user_id)
            tail = engine.config.recompute_tail
            print(f"model: {engine.model_name}; {len(FACTS)} users with "
                  f"{len(FACTS['caroline'])} facts each; {k} retrieved per question")
            print(f"kv:   the facts' KV computed once when added and injected; the last "
                  f"{tail} (nearest the question) computed\ntext: every fact computed from "
                  "its text, as memory frameworks prompt today\n")
            for user_id, question in QUESTIONS:
                answer_both(engine, user_id, question, k)
            print_table(engine)


def answer_both(engine: MemoryEngine, user_id: str, question: str, k: int) -> None:
    """Print the answers of both paths with what each injected and computed."""
    messages = [{"role": "user", "content": question}]
    print(f"[{user_id}] {question}")
    for mode in ("kv", "text"):
        reply = engine.chat(messages, user_id=user_id, k=k, mode=mode, max_tokens=32)
        m = reply.metrics
        print(f"  {mode:<4} TTFT {m.ttft_ms:6.1f} ms; {len(m.injected_fact_ids):2} facts "
              f"injected ({m.injected_tokens:3} tokens), {m.computed_tokens:3} tokens "
              f"computed: {reply.text.strip()}")
    print()


def timed(engine: MemoryEngine, user_id: str, question: str, k: int, mode: str) -> ChatMetrics:
    """One first token on a cold prefix cache: neither path reuses an earlier prompt."""
    engine.reset_prefix_cache()
    messages = [{"role": "user", "content": question}]
    return engine.chat(messages, user_id=user_id, k=k, mode=mode, max_tokens=1).metrics


def print_table(engine: MemoryEngine) -> None:
    """Median TTFT and tokens per path over :data:`TABLE_KS`; where the KV path wins."""
    print(f"TTFT by k: median of {len(TIMED_QUESTIONS)} questions, each asked once per path "
          "after a warm-up call,\nvLLM's prefix cache reset before each call "
          "(nothing is reused from an earlier prompt)")
    print("    k   text TTFT    kv TTFT   kv/text   text computed   kv injected + computed")
    rows = []
    for k in TABLE_KS:
        runs = time_both(engine, k)
        text, kv = (median(m.ttft_ms for m in runs[mode]) for mode in ("text", "kv"))
        injected = tokens(runs["kv"], "injected_tokens")
        rows.append((k, text, kv, injected))
        same = "  (nothing injected: the text path's request)" if not injected else ""
        print(f"  {k:3}  {text:7.1f} ms {kv:7.1f} ms   {kv / text:5.2f}x   "
              f"{tokens(runs['text'], 'computed_tokens'):6} tokens   {injected:4} + "
              f"{tokens(runs['kv'], 'computed_tokens'):3} tokens{same}")
    print(verdict(rows))


def time_both(engine: MemoryEngine, k: int) -> dict[str, list[ChatMetrics]]:
    """Each timed question on both paths at ``k``, the path asked first alternating."""
    for mode in ("kv", "text"):  # the first call at a new prompt length can be slower
        timed(engine, "omar", "What do you know about Omar?", k, mode)
    runs: dict[str, list[ChatMetrics]] = {"kv": [], "text": []}
    for i, (user_id, question) in enumerate(TIMED_QUESTIONS):
        for mode in ("kv", "text") if i % 2 else ("text", "kv"):
            runs[mode].append(timed(engine, user_id, question, k, mode))
    return runs


def tokens(runs: list[ChatMetrics], name: str) -> int:
    return int(median(getattr(m, name) for m in runs))


def verdict(rows: list[tuple[int, float, float, int]]) -> str:
    """What the table shows: the smallest k from which the KV path, injecting facts, had
    the lower median TTFT at every k measured, and by how much at the largest.

    >>> verdict([(5, 160.0, 158.0, 0), (10, 370.0, 155.0, 91), (40, 1400.0, 435.0, 431)])
    'here the KV path was faster from k=10 on; at k=40: 435 ms against 1400 ms (3.2x, 965 ms less)'
    """
    wins_from = None
    for k, text, kv, injected in reversed(rows):
        if not injected or kv >= text:
            break
        wins_from = k
    if wins_from is None:
        return "here the KV path was not faster at the largest k"
    k, text, kv, _ = rows[-1]
    return (f"here the KV path was faster from k={wins_from} on; at k={k}: {kv:.0f} ms "
            f"against {text:.0f} ms ({text / kv:.1f}x, {text - kv:.0f} ms less)")
