"""vLLM's tool parsers, as the user's process uses them: which one reads a chat template's
call format, and the calls of a finished answer read with it.

The parsers are named as vLLM's ``--tool-call-parser`` names them; that each one exists and
takes what :func:`~inferscale_memory.driver.frontend.extract_tool_calls` hands it is checked
by ``tests/test_vllm_contract.py``. What the rest of the package knows of tools (the checked
options, our own tool prompt, the stream) is :mod:`inferscale_memory.tools`.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Parsers of vLLM, by a marker of the chat template.
TEMPLATE_PARSERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"),
                    ("ipython", "llama3_json"))
# Reads the calls of our own tool prompt (inferscale_memory.tools.prompt.TOOL_PROMPT:
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>).
OWN_TOOL_PARSER = "hermes"
_CALL_BLOCK = re.compile(r"<tool_call>\s*(\[.*?\])\s*</tool_call>", re.DOTALL)


def format_parser(chat_template: str) -> str:
    """vLLM's tool parser for the call format a chat template that renders tools asks for
    (whether the prompt uses the template's tools or our own tool prompt is
    :attr:`~inferscale_memory.layout.PromptBuilder.tool_parser`'s decision)."""
    for marker, parser in TEMPLATE_PARSERS:
        if marker in chat_template:
            return parser
    return "hermes"  # vLLM's generic JSON-in-tags format


def read_tool_calls(parser: str, tools: list[dict[str, Any]], text: str,
                    tokenizer: Any) -> tuple[str | None, list[tuple[str, str]]]:
    """The content (``None`` when empty) and the calls, as (name, JSON arguments) pairs, of
    a finished answer's ``text``, read by vLLM's tool parser ``parser``; ``text`` and no
    calls when it found none."""
    from inferscale_memory.driver.frontend import extract_tool_calls

    if parser == "hermes":
        text = split_call_lists(text)
    return extract_tool_calls(parser, tools, text, tokenizer)


def split_call_lists(text: str) -> str:
    """A ``<tool_call>`` block holding a JSON list of calls (the form of SmolLM2's SFT
    data) as one block per call, the form vLLM's ``hermes`` parser reads."""
    def split(match: re.Match[str]) -> str:
        try:
            calls = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        return "".join(json.dumps(c, ensure_ascii=False).join(("<tool_call>", "</tool_call>"))
                       for c in calls)

    return _CALL_BLOCK.sub(split, text)
