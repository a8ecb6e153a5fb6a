"""SamplingParams and what a request gives back: Delta, RequestStats, Completion."""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from interlock.protocol.conditional import LAWS, Law
from interlock.protocol.errors import InvalidParameterError
from interlock.protocol.types import FinishReason, TokenId


SEED_BITS = 64
MAX_TOKENS_LIMIT = 2**31 - 1         # above: refused (the context caps every request long before)
TOP_K_LIMIT = 2**31 - 1              # above: refused (any top_k >= the vocabulary is "off" anyway)
TEMPERATURE_RANGE = (1e-3, 1e3)      # a positive temperature outside it overflows float32 logits / T
GUIDANCE_LIMIT = 1e3                 # |guidance_scale| above it overflows float32 logits
PENALTY_RANGE = (-2.0, 2.0)          # presence / frequency penalty, as OpenAI
REPETITION_RANGE = (1e-2, 1e2)       # repetition_penalty; 1.0 is off
MAX_STOP_STRINGS = 64                # each one is searched for in the text after every step
MAX_STOP_CHARS = 512                 # a stop string's length is also how much text is held back
MAX_LOGPROBS = 20                    # top alternatives per token (OpenAI's top_logprobs limit)
MAX_ATTEMPTS_LIMIT = 10_000          # law="conditional": attempts one request may take, at most


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. Every field is checked here, at construction: a bad
    value raises InvalidParameterError (a RequestError) naming the field, so nothing invalid ever
    reaches the engine.

    temperature: 0 is greedy; otherwise a number in [1e-3, 1e3] (below, logits / T overflows
    float32: use 0 for greedy). top_k: None (off) or an int >= 1 (values >= the vocabulary size are
    off too). top_p: None (off) or a number in (0, 1]. max_tokens: an int in [1, 2**31 - 1]; the
    context window also caps it (the request then ends with finish_reason "length").
    stop: up to 64 non-empty strings of at most 512 characters that end the output (not included
    in it); a single string or a list is accepted and stored as a tuple.

    seed: None (a fresh random stream) or any int, reduced modulo 2**64 (so -1 and 2**64 - 1 are
    the same seed, and 2**70 is 0); bools and floats are refused. With a seed, a stochastic
    request's output does not depend on what else shares its batch.

    guidance_scale s turns on classifier-free guidance: each step the logits are
    uncond + s * (cond - uncond), where uncond comes from a companion sequence fed the same
    output after an unconditional prompt (Engine.generate's negative_prompt). None: off; else a
    number with |s| <= 1e3. s = 1 samples exactly what no guidance samples (at the companion's
    cost); s = 0 ignores the prompt.

    Repetition remedies (kernels/penalties.py), applied after guidance and before the grammar
    mask, temperature, top-k and top-p:
    presence_penalty (OpenAI; in [-2, 2]): subtracted once from the logit of every token that
    occurs in the output so far. frequency_penalty (OpenAI; in [-2, 2]): subtracted once per
    occurrence in the output. repetition_penalty (CTRL / HF / vLLM; in [0.01, 100], 1 = off): the
    logit of every token that occurs in the prompt or the output is divided by it when positive
    and multiplied by it when negative. Under speculation, verify position j counts the output
    plus the drafts before j, so the result is the same as one token at a time.

    logprobs: None (off, costs nothing) or N in [0, 20]: every emitted token then carries its
    log-probability and the N most likely (token, log-probability) pairs of the same row, under
    the distribution it was verified against (kernels/logprobs.py): the penalized, guided,
    grammar-masked logits after temperature, top-k and top-p. A greedy request reports them at
    temperature 1 (its top-k / top-p still apply). Exact under speculation: a token gets the
    numbers it would get without drafts.

    speculative: False gives this request no drafts at all (one token per step: no forced,
    n-gram, suffix, draft-model or user drafts) while its neighbours keep drafting. Its output
    is the same either way (greedy; and in law when sampled). True does nothing on an engine
    without speculation.

    law: "masked" (default, what every engine samples: each token from the model's distribution
    with the grammar's refused ids removed and the rest renormalised) or "conditional": exact
    samples of the model's law conditioned on the whole output being in the grammar,
    P(x | x in L), by adaptive rejection over attempts (docs/speculation.md, "Two laws"). It needs
    a grammar and a temperature > 0 (at 0 it would be a search for the most probable complete
    output, which interlock does not run), and refuses logprobs, stop strings and ignore_eos. A
    complete output has at most max_tokens - 1 tokens before its stop token; an attempt that runs
    out of context is a rejection. max_attempts (in [1, 10000]) bounds the attempts; past it the
    request fails with ConditionalAttemptsError (never a silent switch to the masked law).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    guidance_scale: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    speculative: bool = True
    law: Law = "masked"
    max_attempts: int = 64

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        t = _real("temperature", self.temperature)
        if t != 0 and not TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]:
            raise InvalidParameterError("temperature", f"must be 0 (greedy) or in [{TEMPERATURE_RANGE[0]}, "
                                                       f"{TEMPERATURE_RANGE[1]}], got {self.temperature!r}")
        put("temperature", t)
        if self.top_k is not None:
            put("top_k", _integer("top_k", self.top_k, 1, TOP_K_LIMIT, "use None to switch top-k off"))
        if self.top_p is not None:
            p = _real("top_p", self.top_p)
            if not 0 < p <= 1:
                raise InvalidParameterError("top_p", f"must be in (0, 1] or None, got {self.top_p!r}")
            put("top_p", p)
        put("max_tokens", _integer("max_tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT))
        put("stop", _stop_strings(self.stop))
        if self.seed is not None:
            put("seed", _integer("seed", self.seed, None, None) % 2**SEED_BITS)
        if not isinstance(self.ignore_eos, bool):
            raise InvalidParameterError("ignore_eos", f"must be a bool, got {type(self.ignore_eos).__name__}")
        if self.guidance_scale is not None:
            put("guidance_scale", _real("guidance_scale", self.guidance_scale, -GUIDANCE_LIMIT, GUIDANCE_LIMIT))
        put("presence_penalty", _real("presence_penalty", self.presence_penalty, *PENALTY_RANGE))
        put("frequency_penalty", _real("frequency_penalty", self.frequency_penalty, *PENALTY_RANGE))
        put("repetition_penalty", _real("repetition_penalty", self.repetition_penalty, *REPETITION_RANGE))
        if self.logprobs is not None:
            put("logprobs", _integer("logprobs", self.logprobs, 0, MAX_LOGPROBS, "use None to switch them off"))
        if not isinstance(self.speculative, bool):
            raise InvalidParameterError("speculative", f"must be a bool, got {type(self.speculative).__name__}")
        put("max_attempts", _integer("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT))
        _check_law(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Some repetition remedy is on (the verifier then counts this request's tokens)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _check_law(s: SamplingParams) -> None:
    """law is a known name; "conditional" refuses what it cannot sample exactly (the docstring)."""
    if s.law not in LAWS:
        raise InvalidParameterError("law", f"must be one of {LAWS}, got {s.law!r}")
    if s.law != "conditional":
        return
    if s.greedy:
        raise InvalidParameterError("law", "law='conditional' at temperature 0 would be a search for the most "
                                           "probable complete output in the grammar, which interlock does not "
                                           "run: give a temperature > 0, or use law='masked' for greedy")
    for name, on in (("logprobs", s.logprobs is not None), ("stop", bool(s.stop)), ("ignore_eos", s.ignore_eos)):
        if on:
            raise InvalidParameterError(name, "cannot be combined with law='conditional'")


def _real(name: str, value: object, low: float | None = None, high: float | None = None) -> float:
    """A finite int or float (not a bool, not a string), as a float, within [low, high] if given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(name, f"must be a number, got {type(value).__name__} {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InvalidParameterError(name, f"must be finite, got {value!r}")
    if (low is not None and x < low) or (high is not None and x > high):
        raise InvalidParameterError(name, f"must be in [{low}, {high}], got {value!r}")
    return x


def _integer(name: str, value: object, low: int | None, high: int | None, hint: str = "") -> int:
    """An int (not a bool, not a float), within [low, high] if given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(name, f"must be an int, got {type(value).__name__} {value!r}")
    n = int(value)
    if (low is not None and n < low) or (high is not None and n > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidParameterError(name, f"must be {bounds}, got {n}" + (f" ({hint})" if hint else ""))
    return n


def _stop_strings(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (tuple, list)):
        raise InvalidParameterError("stop", f"must be a string or a list of strings, got {type(stop).__name__}")
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidParameterError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    for s in stop:
        if not isinstance(s, str) or not s:
            raise InvalidParameterError("stop", f"every stop string must be a non-empty str, got {s!r}")
        if len(s) > MAX_STOP_CHARS:
            raise InvalidParameterError("stop", f"a stop string has at most {MAX_STOP_CHARS} characters, "
                                                f"got {len(s)}")
    return tuple(stop)


@dataclass(frozen=True)
class RequestStats:
    """Per-request numbers, carried by the last Delta and by Completion."""

    prompt_tokens: int
    output_tokens: int
    steps: int                     # verify steps that produced tokens for this request
    step_tokens: int               # tokens those steps produced, a final stop token included
    drafted: int                   # draft tokens proposed and verified
    accepted: int                  # of those, accepted
    ttft_s: float                  # submit -> first token
    elapsed_s: float               # submit -> finish
    exposed_grammar_ms: float      # time the model lane waited for this request's masks
    grammar_compile_ms: float
    cached_prompt_tokens: int = 0  # prompt positions the prefix cache already held (not prefilled)
    attempts: int = 1              # law="conditional": attempts drawn, the accepted one included
    rejected_tokens: int = 0       # law="conditional": tokens the rejected attempts drew (their refused ones too)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step, the bonus/corrected token included (1.0 without speculation)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: the tokens after the first over the time after it. None where there is no
        such time: one token, or every token delivered with the first (a speculative step can bring
        several); 0.0 there would say the request made no progress."""
        decode_s = self.elapsed_s - self.ttft_s
        return (self.output_tokens - 1) / decode_s if decode_s > 0 and self.output_tokens > 1 else None


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the `top` most likely (token, log-probability)
    pairs of the same distribution, most likely first (SamplingParams.logprobs says how many;
    fewer when the grammar allows fewer tokens)."""

    token_id: TokenId
    logprob: float
    top: tuple[tuple[TokenId, float], ...] = ()

    @classmethod
    def from_row(cls, token_id: TokenId, logprob: float, ids: Sequence[TokenId], values: Sequence[float],
                 n: int) -> TokenLogprob:
        """The token and its row's first n alternatives (most likely first), leaving out ids the
        row does not allow (-inf: the grammar allows fewer than n)."""
        return cls(token_id, logprob, tuple((a, lp) for a, lp in zip(ids[:n], values[:n]) if lp > float("-inf")))


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed output: new text (UTF-8 safe), its token ids, and at the end why it ended.

    Under a Reasoning grammar the thinking goes to `reasoning_text` and the answer to `text`
    (max_tokens counts the tokens of both)."""

    text: str
    token_ids: tuple[TokenId, ...]
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None
    reasoning_text: str = ""            # a Reasoning grammar's thinking (its end marker left out)
    logprobs: tuple[TokenLogprob, ...] | None = None   # one per token id (SamplingParams.logprobs set)


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[TokenId, ...]
    finish_reason: FinishReason
    stats: RequestStats
    reasoning_text: str = ""            # a Reasoning grammar's thinking; `text` is then the answer
    logprobs: tuple[TokenLogprob, ...] | None = None   # one per token id (SamplingParams.logprobs set)

    @classmethod
    def of(cls, deltas: Sequence[Delta], with_logprobs: bool) -> Completion:
        """A whole output from its deltas, the last of which finished it (finish_reason and stats)."""
        last = deltas[-1] if deltas else None
        if last is None or last.finish_reason is None or last.stats is None:
            raise ValueError("the deltas of a finished output end with its finish_reason and stats")
        return cls("".join(d.text for d in deltas), tuple(t for d in deltas for t in d.token_ids),
                   last.finish_reason, last.stats, "".join(d.reasoning_text for d in deltas),
                   tuple(lp for d in deltas for lp in d.logprobs or ()) if with_logprobs else None)


def check_guidance(sampling: SamplingParams, negative_prompt: object) -> None:
    """A negative prompt only means something under classifier-free guidance."""
    if negative_prompt is not None and sampling.guidance_scale is None:
        raise InvalidParameterError("negative_prompt", "needs classifier-free guidance: set guidance_scale")
