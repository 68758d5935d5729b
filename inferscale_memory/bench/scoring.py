"""Answer and retrieval scores of the LoCoMo benchmark.

Token F1 follows the LoCoMo paper's evaluation code (snap-research/locomo,
``task_eval/evaluation.py``): answers are lower-cased, commas, punctuation and the words
"a", "an", "the", "and" removed, tokens Porter-stemmed, then F1 over the token multisets.
Multi-hop questions (category 1) use partial F1: the gold answer and the prediction are
split at commas, and each gold sub-answer scores its best-matching predicted piece; the
score is their mean. Open-domain gold answers (category 3) keep the part before the first
``;``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from inferscale_memory.errors import MissingDependencyError

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
MULTI_HOP = 1
OPEN_DOMAIN = 3


@lru_cache(maxsize=1)
def _stemmer():  # type: ignore[no-untyped-def]
    try:
        from nltk.stem import PorterStemmer
    except ImportError as exc:
        raise MissingDependencyError(
            "LoCoMo scoring needs nltk's Porter stemmer: pip install 'inferscale-memory[bench]'"
        ) from exc
    return PorterStemmer()


def normalize_answer(text: str) -> str:
    """LoCoMo's answer normalisation (before stemming).

    Example:
        >>> normalize_answer("The Eiffel-Tower, and a park!")
        'eiffeltower park'
    """
    text = text.replace(",", "").lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    stem = _stemmer().stem
    return [stem(word) for word in normalize_answer(text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """Normalised, stemmed token F1 of one prediction against one gold answer.

    Example:
        >>> round(token_f1("She went to Paris", "Paris"), 2)
        0.4
    """
    predicted, expected = answer_tokens(prediction), answer_tokens(gold)
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def partial_f1(prediction: str, gold: str) -> float:
    """Multi-hop F1: mean over the gold's comma-separated parts of their best piece's F1.

    Example:
        >>> partial_f1("painting, hiking", "hiking, painting, swimming")
        0.6666666666666666
    """
    pieces = [p.strip() for p in prediction.split(",")]
    parts = [g.strip() for g in gold.split(",")]
    return sum(max(token_f1(p, g) for p in pieces) for g in parts) / len(parts)


def locomo_f1(prediction: str, gold: str, category: int) -> float:
    """The LoCoMo score of one answer for questions of categories 1-4."""
    if category == MULTI_HOP:
        return partial_f1(prediction, gold)
    if category == OPEN_DOMAIN:
        gold = gold.split(";")[0].strip()
    return token_f1(prediction, gold)


def agreement(a: Sequence[int], b: Sequence[int]) -> tuple[bool, float]:
    """Whether two greedy outputs are identical, and their common prefix over the longer.

    Example:
        >>> agreement([1, 2, 3, 4], [1, 2, 9])
        (False, 0.5)
    """
    longest = max(len(a), len(b))
    if longest == 0:
        return True, 1.0
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return list(a) == list(b), common / longest


def evidence_recall(evidence: Iterable[str], retrieved: Iterable[Iterable[str]]) -> float | None:
    """Share of the question's evidence dialogue ids covered by the retrieved facts.

    ``None`` when the question names no evidence (it is left out of the averages).

    Example:
        >>> evidence_recall(["D1:3", "D2:5"], [["D1:3"], ["D4:1"]])
        0.5
    """
    wanted = set(evidence)
    if not wanted:
        return None
    found = {dia_id for fact in retrieved for dia_id in fact}
    return len(wanted & found) / len(wanted)
