"""The LoCoMo dataset (Maharana et al., ACL 2024) as memory facts and questions.

The data is CC BY-NC 4.0: it is read from the user's path and never shipped. A file is a
list of conversations; each has ``conversation`` (``session_N`` turns and
``session_N_date_time``), ``observation`` (``session_N_observation``: per speaker, a list
of ``[fact, evidence dia_id(s)]``) and ``qa`` (``question``, ``answer``, ``evidence``,
``category``). Categories 1-4 (multi-hop, temporal, open-domain, single-hop) are kept;
category 5 (adversarial, no ``answer``) is left out as in the usual protocol.

Example:
    >>> conversations = load_locomo("locomo10.json")               # doctest: +SKIP
    >>> facts = conversations[0].facts("observations")              # doctest: +SKIP
    >>> facts[0].text                                               # doctest: +SKIP
    '[8 May 2023] Caroline attended an LGBTQ support group recently ...'
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inferscale_memory.errors import InvalidInputError

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
MEMORY_UNITS = ("observations", "turns")
# Evidence ids are "D<session>:<turn>"; a few in the data read "D:11:26" or "D8:6; D9:17".
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)$")


@dataclass(frozen=True)
class LocomoFact:
    """One memory unit: its text (date prefixed) and the dialogue ids it comes from."""

    text: str
    dia_ids: tuple[str, ...]
    session: int


@dataclass(frozen=True)
class LocomoQuestion:
    index: int  # position in the conversation's ``qa`` list (stable across subsets)
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class LocomoConversation:
    sample_id: str
    observations: tuple[LocomoFact, ...]
    turns: tuple[LocomoFact, ...]
    questions: tuple[LocomoQuestion, ...]

    def facts(self, memory: str = "observations") -> tuple[LocomoFact, ...]:
        """The memory facts: per-session ``observations`` or raw dialogue ``turns``."""
        if memory not in MEMORY_UNITS:
            raise InvalidInputError(f"memory must be one of {MEMORY_UNITS}, got {memory!r}")
        return self.observations if memory == "observations" else self.turns


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Read a LoCoMo-format JSON file."""
    try:
        samples = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"cannot read the LoCoMo file {path}: {exc}") from exc
    if not isinstance(samples, list):
        raise InvalidInputError(f"{path}: expected a list of conversations")
    return [_conversation(i, sample) for i, sample in enumerate(samples)]


def select(conversations: list[LocomoConversation], which: list[str] | None = None,
           limit: int | None = None, seed: int = 0) -> list[LocomoConversation]:
    """A subset: conversations by index or ``sample_id``; at most ``limit`` questions each,
    drawn with ``seed`` and kept in dataset order."""
    chosen = conversations if not which else [_find(conversations, w) for w in which]
    if limit is None:
        return list(chosen)
    subset = []
    for conv in chosen:
        rng = random.Random(f"{seed}:{conv.sample_id}")
        picked = rng.sample(conv.questions, min(limit, len(conv.questions)))
        subset.append(replace(conv, questions=tuple(sorted(picked, key=lambda q: q.index))))
    return subset


def parse_dia_ids(value: Any) -> tuple[str, ...]:
    """Dialogue ids from a string or a list of strings, malformed ones repaired or dropped.

    Example:
        >>> parse_dia_ids(["D1:3", "D:11:26", "D8:6; D9:17", "D"])
        ('D1:3', 'D11:26', 'D8:6', 'D9:17')
    """
    parts = value if isinstance(value, list) else [value]
    found = (f"D{s}:{t}" for part in parts for s, t in _DIA_ID.findall(str(part)))
    return tuple(dict.fromkeys(found))


def _find(conversations: list[LocomoConversation], which: str) -> LocomoConversation:
    if which.isdigit() and int(which) < len(conversations):
        return conversations[int(which)]
    for conv in conversations:
        if conv.sample_id == which:
            return conv
    raise InvalidInputError(f"no conversation {which!r} (give an index or a sample_id)")


def _conversation(position: int, sample: dict[str, Any]) -> LocomoConversation:
    dialogue = sample.get("conversation", {})
    dates = {int(m.group(1)): _date(dialogue.get(f"{key}_date_time", ""))
             for key in dialogue if (m := _SESSION.match(key))}
    return LocomoConversation(
        sample_id=str(sample.get("sample_id", position)),
        observations=tuple(_observations(sample.get("observation", {}), dates)),
        turns=tuple(_turns(dialogue, dates)),
        questions=tuple(_questions(sample.get("qa", []))))


def _date(raw: str) -> str:
    """``"1:56 pm on 8 May, 2023"`` -> ``"8 May 2023"``."""
    return raw.split(" on ", 1)[-1].replace(",", "").strip()


def _observations(observation: dict[str, Any], dates: dict[int, str]) -> list[LocomoFact]:
    facts = []
    for key in sorted(observation, key=_session_number):
        session = _session_number(key)
        for items in observation[key].values():
            for text, evidence in items:
                facts.append(LocomoFact(_dated(dates.get(session, ""), text),
                                        parse_dia_ids(evidence), session))
    return facts


def _turns(dialogue: dict[str, Any], dates: dict[int, str]) -> list[LocomoFact]:
    facts = []
    for session in sorted(dates):
        for turn in dialogue.get(f"session_{session}", []):
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares {turn['blip_caption']}]"
            facts.append(LocomoFact(_dated(dates[session], text),
                                    parse_dia_ids(turn.get("dia_id", "")), session))
    return facts


def _questions(qa: list[dict[str, Any]]) -> list[LocomoQuestion]:
    return [LocomoQuestion(i, str(item["question"]), str(item["answer"]), int(item["category"]),
                           parse_dia_ids(item.get("evidence", [])))
            for i, item in enumerate(qa)
            if int(item.get("category", 0)) in CATEGORIES and item.get("answer") is not None]


def _session_number(key: str) -> int:
    digits = re.findall(r"\d+", key)
    return int(digits[0]) if digits else 0


def _dated(date: str, text: str) -> str:
    return f"[{date}] {text.strip()}" if date else text.strip()
