"""Tool calls and structured output of :meth:`MemoryEngine.chat`, in OpenAI's shapes.

The memory span is untouched: the tools go into the model's own chat template (after the
facts, in the footer), so the facts are injected as KV exactly as without tools. What
vLLM already has does the rest:

- ``tool_choice="auto"``: the model writes its calls in its own format and one of vLLM's
  tool parsers reads them (``hermes`` for Qwen2.5's ``<tool_call>`` blocks,
  ``llama3_json`` for Llama 3.x); the parser is chosen from the chat template and can be
  overridden (:attr:`MemoryEngine.tool_parser`).
- ``tool_choice="required"`` or a named function, and ``response_format``
  (``json_object``, ``json_schema``): vLLM's structured outputs (guided decoding) constrain
  the answer to JSON of the schema, as vLLM's own server does: a list of
  ``{"name", "parameters"}`` for ``required``, the function's arguments for a named one.
  Guided decoding works on any model, even one without a tool template.

A model whose chat template ignores ``tools`` (the embedded SmolLM2-135M), or renders them
before the system message (Llama 3.1 and 3.2 write "Environment: ipython" into the system
header, so the facts would follow another header than the one they were captured after),
gets our own minimal tool prompt instead (:func:`tool_prompt`, hermes-style, in the system
part after the facts): the tool schemas as a JSON list in ``<tools></tools>``, and calls
answered as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, which vLLM's
``hermes`` parser reads. Tool results and the assistant's earlier calls become text of user
and assistant turns (:func:`own_template_messages`). Setting
:attr:`MemoryEngine.tool_parser` to ``None`` refuses tools on such a model instead.

The parts, by noun: :mod:`.shapes` (OpenAI's shapes of the options, which the server's
OpenAPI document shows too), :mod:`.checks` (the options of a call, checked), :mod:`.request`
(:class:`ToolRequest`: what they ask of guided decoding, and the answer read back),
:mod:`.calls` (the calls, whole and streamed), :mod:`.stream` (:class:`ToolStream`) and
:mod:`.prompt` (the template probe, our own tool prompt, tool turns as templates take
them). Which of vLLM's tool parsers reads a template's calls, and reading them, is the
driver's (:mod:`inferscale_memory.driver.tool_parsing`). Every name is imported from here.

Example:
    >>> reply = engine.chat(messages, user_id="caroline", tools=[WEATHER],  # doctest: +SKIP
    ...                     tool_choice="required")
    >>> reply.tool_calls[0].name, json.loads(reply.tool_calls[0].arguments)  # doctest: +SKIP
    ('get_weather', {'city': 'Berlin'})
"""

from __future__ import annotations

from inferscale_memory.driver.tool_parsing import (
    OWN_TOOL_PARSER,
    TEMPLATE_PARSERS,
    format_parser,
    split_call_lists,
)
from inferscale_memory.tools.calls import (
    ToolCall,
    ToolCallDelta,
    check_tool_calls,
    new_call_id,
)
from inferscale_memory.tools.checks import check_tool_request
from inferscale_memory.tools.prompt import (
    PROBE_TOOL,
    TOOL_MODELS,
    TOOL_PROMPT,
    call_text,
    own_template_messages,
    refuse_without_template,
    template_messages,
    template_renders_tools,
    tool_prompt,
)
from inferscale_memory.tools.request import ToolRequest
from inferscale_memory.tools.shapes import RESPONSE_FORMATS, TOOL_CHOICES, TOOL_NAME
from inferscale_memory.tools.stream import ToolStream

__all__ = [
    "OWN_TOOL_PARSER", "PROBE_TOOL", "RESPONSE_FORMATS", "TEMPLATE_PARSERS", "TOOL_CHOICES",
    "TOOL_MODELS", "TOOL_NAME", "TOOL_PROMPT", "ToolCall", "ToolCallDelta", "ToolRequest",
    "ToolStream", "call_text", "check_tool_calls", "check_tool_request", "format_parser",
    "new_call_id", "own_template_messages", "refuse_without_template", "split_call_lists",
    "template_messages", "template_renders_tools", "tool_prompt",
]
