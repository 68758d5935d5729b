"""The one error hierarchy of inferscale-memory.

Every error the library raises on purpose is an :class:`InferScaleError`, so callers can
catch one type. Messages say what to do next.
"""

from __future__ import annotations

# What an error about missing weights (the default model, the default embedder) tells the
# user to run; the library itself never installs or downloads anything.
PREPARE_COMMAND = "inferscale-memory prepare"


class InferScaleError(Exception):
    """Base class of every error raised by inferscale-memory."""


class ConfigError(InferScaleError, ValueError):
    """A configuration value is missing, malformed or contradicts another one."""


class InvalidInputError(InferScaleError, ValueError):
    """An argument is malformed: empty or oversized fact, bad ``k``, bad messages, ...

    Attributes:
        param: The request parameter at fault where one is named, in OpenAI's dotted form
            (``"messages.2.tool_call_id"``, ``"tools.0.function.parameters"``); the
            server's 400 names it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownUserError(InferScaleError, KeyError):
    """The ``user_id`` has no facts (or does not exist)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class FactNotFoundError(InferScaleError, KeyError):
    """No fact with this id exists for this user (it may belong to another user)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ContextLengthError(InvalidInputError):
    """The prompt (memory + conversation) does not fit the model's context window."""


class SchemaError(InvalidInputError):
    """A JSON schema (``response_format``, a tool's ``parameters``) cannot guide decoding:
    it asks too much of the grammar compiler (``SchemaLimitError``), or vLLM's guided
    decoding failed on it (a grammar that did not compile or admits no answer).

    Attributes:
        param: The request parameter at fault (always named).
    """

    param: str


class ModelPreparationError(InferScaleError, RuntimeError):
    """The model could not be located, fetched or converted."""


class EngineError(InferScaleError, RuntimeError):
    """The vLLM engine failed to start or to answer."""


class RequestFailedError(EngineError):
    """vLLM ended this request as an error (its ``finish_reason`` "error") while the engine
    goes on serving: its engine core failed this one request, not because of the caller's
    input (a guided request's schema is a :class:`SchemaError` instead). vLLM's own log
    says why; sending the request again may succeed. Over HTTP: 500 ``engine_request_failed``.
    """


class EngineDiedError(EngineError):
    """vLLM's engine core process died (killed, out of memory, or crashed: vLLM's log says
    why), so the engine answers nothing more: every call that needs vLLM raises this at
    once, with vLLM's ``EngineDeadError`` as its cause, and ``healthy`` is ``False``.
    Close the engine and start a new :class:`~inferscale_memory.MemoryEngine` (a server:
    restart it); the facts are in the store, their KV is recomputed as answers need it.
    Over HTTP: 503 ``engine_unavailable``.
    """


class EngineClosedError(EngineError):
    """The engine was closed: start a new :class:`~inferscale_memory.MemoryEngine`."""


class UnsupportedVersionError(InferScaleError, ImportError):
    """The installed vLLM is outside the supported range."""


class MissingDependencyError(InferScaleError, ImportError):
    """An optional dependency is not installed; the message names the install command."""


class StoreError(InferScaleError, RuntimeError):
    """The fact store cannot be used; the message names the file and what to do.

    Raised when the store is closed, the file is not a store, or it was written by a newer
    version of inferscale-memory or with an embedder of another dimension.
    """
