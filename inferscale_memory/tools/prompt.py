"""Tools in the prompt: whether a chat template renders them (the probe), our own tool
prompt for one that does not, and the messages of a conversation with tool turns as each
kind of template takes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from inferscale_memory.errors import InvalidInputError

TOOL_MODELS = ("Qwen2.5-Instruct (its chat template, hermes)",
               "any other (our own tool prompt, hermes)")
PROBE_TOOL = {"type": "function", "function": {"name": "inferscale_probe", "parameters": {}}}
# Our own tool prompt, for a chat template that ignores tools. SmolLM2's SFT data (APIGen)
# lists the functions as JSON in <tools></tools> and calls them in <tool_call> tags, which
# vLLM's hermes parser reads (driver/tool_parsing.py's OWN_TOOL_PARSER).
TOOL_PROMPT = (
    "You can call these tools:\n<tools>{tools}</tools>\n\n"
    "To call a tool, answer with one line per call and nothing else:\n"
    '<tool_call>{{"name": "tool_name", "arguments": {{"argument": "value"}}}}</tool_call>\n'
    "If no tool is needed, answer the user directly.")


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders ``tools`` at all."""
    probe = [{"role": "user", "content": "probe"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[PROBE_TOOL], tokenize=False,
                                                   add_generation_prompt=True)
    except Exception:  # a template that fails on tools has none
        return False
    return "inferscale_probe" in with_tools


def refuse_without_template(model: str) -> InvalidInputError:
    """The error for tools sent to an engine whose ``tool_parser`` was set to ``None``."""
    return InvalidInputError(
        f"tools are off for the model {model} (the engine's tool_parser is None); set it to "
        f"a vLLM tool parser, or use a model whose chat template renders tools "
        f"({', '.join(TOOL_MODELS)}). response_format (json_object, json_schema) works on "
        "any model")


def tool_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """Our own tool prompt (:data:`TOOL_PROMPT`) for ``tools``: the functions' ``name``,
    ``description`` and ``parameters`` as one JSON list."""
    functions = [{key: t["function"][key] for key in ("name", "description", "parameters")
                  if key in t["function"]} for t in tools]
    return TOOL_PROMPT.format(tools=json.dumps(functions, ensure_ascii=False))


def call_text(name: str, arguments: str) -> str:
    """One call in our own tool prompt's format (``arguments``: JSON text of an object)."""
    return json.dumps({"name": name, "arguments": json.loads(arguments)},
                      ensure_ascii=False).join(("<tool_call>", "</tool_call>"))


def own_template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checked messages (:class:`~inferscale_memory.conversation.Conversation`) for a chat
    template that knows no tools: an assistant's ``tool_calls`` become its text (one
    :func:`call_text` line each), and a run of ``tool`` results becomes one user turn of
    ``<tool_response>`` blocks."""
    out: list[dict[str, Any]] = []
    after_tool = False
    for message in messages:
        if message.get("tool_calls"):
            lines = [call_text(c["function"]["name"], c["function"]["arguments"])
                     for c in message["tool_calls"]]
            content = "\n".join([message["content"], *lines] if message["content"] else lines)
            out.append({"role": "assistant", "content": content})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if after_tool:
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{block}"}
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append(message)
        after_tool = message["role"] == "tool"
    return out


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates take them: a tool call's ``arguments`` as
    an object, not OpenAI's JSON text (as vLLM's own server hands them over)."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**call, "function": {**call["function"],
                                           "arguments": json.loads(call["function"]["arguments"])}}
                     for call in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out
