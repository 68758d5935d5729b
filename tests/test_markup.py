"""Our tool prompt's tags are taken out of answer text, whole or streamed in any pieces."""

from __future__ import annotations

import itertools

import pytest

from inferscale_memory.markup import MARKUP_TAGS, MarkupFilter, strip_markup

ECHOES = {  # SmolLM2 echoes a tool result (the adapters' and server's test_*markup*.py)
    "You can call this tool:\n<tool_response>\n12 C and rain in Berlin":
        "You can call this tool:\n12 C and rain in Berlin",
    "<tool_response>\n12 C and rain in Berlin\n</tool_response>\n": "12 C and rain in Berlin\n",
    'Calling it.\n<tool_call>{"name": "f"}</tool_call>\nDone.': 'Calling it.\n{"name": "f"}\nDone.',
    "It is <tools>sunny</tools> today.": "It is sunny today.",
}
PLAIN = ["12 C and rain in Berlin", "a < b and c > d", "<b>bold</b>\n", "<tool", "x <tool_resp",
         "\n\n", ""]


@pytest.mark.parametrize(("text", "shown"), ECHOES.items())
def test_the_tags_go_and_the_text_between_them_stays(text: str, shown: str) -> None:
    assert strip_markup(text) == shown
    assert not any(tag in strip_markup(text) for tag in MARKUP_TAGS)


@pytest.mark.parametrize("text", PLAIN)
def test_text_without_our_tags_is_untouched(text: str) -> None:
    assert strip_markup(text) == text


def streamed(text: str, cuts: tuple[int, ...]) -> str:
    markup = MarkupFilter()
    bounds = [0, *cuts, len(text)]
    shown = [markup.feed(text[start:end]) for start, end in itertools.pairwise(bounds)]
    return "".join(shown) + markup.flush()


@pytest.mark.parametrize("text", [*ECHOES, *PLAIN])
def test_a_stream_cut_anywhere_shows_what_the_whole_answer_shows(text: str) -> None:
    for cuts in itertools.chain(itertools.combinations(range(1, len(text)), 1),
                                itertools.combinations(range(1, len(text)), 2)):
        assert streamed(text, cuts) == strip_markup(text), cuts
    assert streamed(text, tuple(range(1, len(text)))) == strip_markup(text)  # char by char


def test_a_piece_that_may_begin_a_tag_waits_for_the_next() -> None:
    markup = MarkupFilter()
    assert markup.feed("It is:\n<tool_") == "It is:\n"
    assert markup.feed("response>\n12 C") == "12 C"  # alone on its line: with its break
    assert markup.feed(" <to") == " "
    assert markup.flush() == "<to"  # the answer ended: it was no tag
