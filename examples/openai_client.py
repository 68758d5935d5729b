"""Point the official ``openai`` client at ``inferscale-memory serve``.

Start the server first (in another terminal)::

    inferscale-memory serve --port 8000            # localhost, no API keys

then run ``python examples/openai_client.py``. With API keys (``--api-keys keys.json``),
set ``OPENAI_API_KEY`` to a key bound to the user below (or to ``"*"``).
"""

from __future__ import annotations

import os
import uuid

import httpx
from openai import OpenAI

BASE_URL = os.environ.get("INFERSCALE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("OPENAI_API_KEY", "none")
USER = f"zora-example-{uuid.uuid4().hex[:8]}"  # a user of its own, deleted at the end


def main() -> None:
    """Store a fact through /v1/memories, then ask about it with and without memory."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=BASE_URL, headers=headers, timeout=120) as http:
        added = http.post("/memories", json={"user_id": USER,
                                             "text": ["Zora's dog is called Pepper.",
                                                      "Zora lives in Lisbon."]})
        added.raise_for_status()
        print("stored:", [m["text"] for m in added.json()["data"]])

    client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "What is the name of Zora's dog?"}]
    for mode in ("kv", "text", "off"):
        reply = client.chat.completions.create(
            model=model, messages=question, max_tokens=24, user=USER,
            extra_body={"memory": {"k": 5, "mode": mode}})
        usage, memory = reply.usage, reply.memory  # type: ignore[attr-defined]
        print(f"[{mode:>4}] {reply.choices[0].message.content!r}")
        print(f"       prompt {usage.prompt_tokens} tokens, injected "  # type: ignore[union-attr]
              f"{usage.injected_tokens}, computed {usage.computed_prompt_tokens}, "  # type: ignore
              f"TTFT {memory['ttft_ms']:.1f} ms, facts {memory['fact_ids']}")

    print("streamed: ", end="", flush=True)
    for chunk in client.chat.completions.create(model=model, messages=question, max_tokens=24,
                                                user=USER, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()
    with httpx.Client(base_url=BASE_URL, headers=headers, timeout=120) as http:
        http.delete("/memories", params={"user_id": USER, "all": "true"}).raise_for_status()


if __name__ == "__main__":
    main()
