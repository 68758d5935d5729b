"""Point the official ``openai`` client at ``inferscale-memory serve``.

Start the server first (in another terminal; its engine starts once, and every run of this
example reuses it)::

    inferscale-memory serve --port 8000            # localhost, no API keys

then run ``python examples/openai_client.py [--base-url http://HOST:8000/v1]`` (default
``$INFERSCALE_URL``, else localhost:8000). With API keys (``--api-keys keys.json``), set
``OPENAI_API_KEY`` to a key bound to the user below (or to ``"*"``).
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import Any

import httpx
from facts import CAROLINE
from openai import OpenAI

BASE_URL = os.environ.get("INFERSCALE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("OPENAI_API_KEY", "none")


def run(base_url: str = BASE_URL, api_key: str = API_KEY) -> list[Any]:
    """Store facts through /v1/memories, ask about them, delete them; returns the replies."""
    user = f"caroline-example-{uuid.uuid4().hex[:8]}"  # a user of its own, deleted at the end
    with httpx.Client(base_url=base_url, timeout=120,
                      headers={"Authorization": f"Bearer {api_key}"}) as http:
        http.post("/memories", json={"user_id": user, "text": CAROLINE}).raise_for_status()
        try:
            return ask(OpenAI(base_url=base_url, api_key=api_key), user)
        finally:
            http.delete("/memories", params={"user_id": user, "all": "true"})


def ask(client: OpenAI, user: str) -> list[Any]:
    """One question with memory by KV, by text and off; then streamed."""
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "What is the name of Caroline's dog?"}]
    replies = []
    for mode in ("kv", "text", "off"):
        reply = client.chat.completions.create(
            model=model, messages=question, max_tokens=24, user=user,
            extra_body={"memory": {"k": 10, "mode": mode}})
        usage, memory = reply.usage, reply.memory  # type: ignore[attr-defined]
        print(f"[{mode}] injected {usage.injected_tokens} tokens, computed "  # type: ignore
              f"{usage.computed_prompt_tokens}, TTFT {memory['ttft_ms']:.0f} ms: "  # type: ignore
              f"{reply.choices[0].message.content!r}")
        replies.append(reply)
    print("streamed: ", end="", flush=True)
    for chunk in client.chat.completions.create(model=model, messages=question, max_tokens=24,
                                                user=user, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()
    return replies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=BASE_URL,
                        help="the server's OpenAI API (default: %(default)s)")
    run(parser.parse_args(argv).base_url)


if __name__ == "__main__":
    main()
