"""Typed errors. Each one is raised for one request (or one load) and says what to do about it.

The hierarchy lets callers catch broadly (`InterlockError`) or narrowly. None of them means the
engine is broken except `EngineError` and its subclasses.
"""
from __future__ import annotations


class InterlockError(Exception):
    """Base of every error interlock raises on purpose."""


# --- loading ---------------------------------------------------------------------------------

class ModelLoadError(InterlockError):
    """A model could not be loaded."""


class ModelNotFoundError(ModelLoadError):
    """The named model or file does not exist (the message says how to get it)."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint uses an architecture, quantization type or option we do not implement."""


class DeviceUnavailableError(ModelLoadError):
    """The device asked for is not there (no CUDA device, or a torch built without CUDA)."""


# --- per-request input -----------------------------------------------------------------------

class RequestError(InterlockError):
    """Bad input for one request; the engine and other requests are unaffected."""


class PromptTooLongError(RequestError):
    """Prompt (plus at least one generated token) does not fit the model's context window."""


class EmptyPromptError(RequestError):
    """The prompt is empty (an empty string, or an empty message list): give at least one token."""


class InvalidParameterError(RequestError):
    """A request parameter has the wrong type or is out of range; `field` names it (e.g. "temperature")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class GrammarError(RequestError):
    """A grammar spec could not be compiled (bad spec, unsupported feature, over a cap, timeout)."""


class SchemaKeywordError(GrammarError):
    """No backend can enforce this JSON schema keyword exactly (grammars/LENIENCY.md).

    keyword: the keyword; path: the JSON pointer of the subschema that holds it. Pass
    `JsonSchema(..., lenient=True)` to compile loosely and rely on the end-of-request check: the
    message says so, `reason` is the message without that Python-only advice (`user_message`).
    """

    LENIENT = "JsonSchema(..., lenient=True) compiles it loosely and relies on the end-of-request check"

    def __init__(self, message: str, *, keyword: str, path: str) -> None:
        super().__init__(f"{message}. {self.LENIENT}")
        self.reason = message
        self.keyword = keyword
        self.path = path


def user_message(exc: InterlockError) -> str:
    """The message for a user of the CLI or the server, where Python's options do not exist:
    without the advice to pass `JsonSchema(..., lenient=True)`."""
    return exc.reason if isinstance(exc, SchemaKeywordError) else str(exc)


class UnsupportedFeatureError(RequestError):
    """The device runner does not run a feature yet; the message names it and where it runs:
    "... not on CUDA yet" on a GPU, "... not on the device runner yet" where that runner runs on the CPU."""

    def __init__(self, feature: str, where: str = "CUDA") -> None:
        fix = "run it on the CPU engine (device='cpu')" if where == "CUDA" else "the CPU engine (runner='host') has it"
        super().__init__(f"{feature} is not on {where} yet: {fix}")
        self.feature = feature


def not_yet_on(device_type: str) -> str:
    """Where the device runner lacks a feature, as its errors name it."""
    return "CUDA" if device_type == "cuda" else "the device runner"


class SamplingError(RequestError):
    """A step could not sample this request: its logits row had a NaN or allowed no token at all."""


class DrafterError(RequestError):
    """A drafter (a user-provided one, typically) raised for this request."""


class AttemptRefused(RequestError):
    """One attempt of a law="conditional" request drew a token its grammar refuses (a rejection).
    Internal: the engine's driver catches it, learns from `visits` (one protocol.conditional.Visit
    per token of the attempt, the refused one last) and starts the next attempt; no caller sees it."""

    def __init__(self, visits: tuple) -> None:
        super().__init__(f"the attempt's token {len(visits)} is refused by the grammar")
        self.visits = visits


class ConditionalAttemptsError(RequestError):
    """A law="conditional" request drew no complete output in its grammar within
    SamplingParams.max_attempts attempts: the model gives the grammar too little mass (raise
    max_attempts, or use law="masked", which always ends but samples a different law)."""

    def __init__(self, attempts: int, live_mass: float) -> None:
        super().__init__(f"law='conditional': no output in the grammar after {attempts} attempts (the model's "
                         f"mass not yet proved outside the grammar is {live_mass:.3g}): raise max_attempts, "
                         "or use law='masked'")
        self.attempts = attempts
        self.live_mass = live_mass


# --- capacity --------------------------------------------------------------------------------

class CapacityError(InterlockError):
    """A resource pool is exhausted."""


class KVCacheExhaustedError(CapacityError):
    """The paged KV pool has no free block for this request."""


# --- engine ----------------------------------------------------------------------------------

class EngineError(InterlockError):
    """The engine failed; every in-flight request gets this (or a subclass)."""


class EngineClosedError(EngineError):
    """The engine was closed while the request was in flight, or before it was submitted."""


class WorkerError(EngineError):
    """A tensor-parallel worker process died, hung past the step timeout, or raised; the engine
    cannot run another step (every in-flight request gets this)."""


class StepOverdueError(EngineError):
    """A step did not report back within EngineConfig.step_timeout_s (a hung kernel or host
    function): the watchdog failed the engine rather than let every request wait forever."""


# --- bounded queues (the actors' channels, a request's output stream) -------------------------
# "The other side is gone" subclasses EngineClosedError, so if one ever reaches a user it still reads
# correctly.

class WouldBlockError(InterlockError):
    """A `_nowait` call could not complete without waiting."""


class ChannelFullError(WouldBlockError):
    """`send_nowait` found the channel's buffer full (nobody is waiting to receive)."""


class ChannelEmptyError(WouldBlockError):
    """`receive_nowait` found nothing buffered (and the channel is still open)."""


class ChannelClosedError(EngineClosedError):
    """A send to a channel that was closed; its receiver accepts nothing more."""


class EndOfChannelError(InterlockError):
    """A receive from a channel that is closed and fully drained."""
