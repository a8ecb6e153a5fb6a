"""SamplingParams and what a request gives back: Delta, RequestStats, Completion."""
from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.protocol.types import FinishReason, TokenId


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    temperature 0 is greedy. top_k None / top_p None switch those filters off. seed makes a
    stochastic request reproducible whatever else shares its batch. stop: strings that end the
    output (not included in it). max_tokens bounds the generated tokens.

    guidance_scale s turns on classifier-free guidance: each step the logits are
    uncond + s * (cond - uncond), where uncond comes from a companion sequence fed the same
    output after an unconditional prompt (Engine.generate's negative_prompt). None: off. s = 1
    samples exactly what no guidance samples (at the companion's cost); s = 0 ignores the prompt.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    guidance_scale: float | None = None

    def __post_init__(self) -> None:
        from interlock.protocol.errors import RequestError

        if self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise RequestError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise RequestError("stop strings must be non-empty")
        if self.guidance_scale is not None and not math.isfinite(self.guidance_scale):
            raise RequestError(f"guidance_scale must be a finite number or None, got {self.guidance_scale}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step, the bonus/corrected token included (1.0 without speculation)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        decode_s = self.elapsed_s - self.ttft_s
        return (self.output_tokens - 1) / decode_s if decode_s > 0 and self.output_tokens > 1 else 0.0


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed output: new text (UTF-8 safe), its token ids, and at the end why it ended."""

    text: str
    token_ids: tuple[TokenId, ...]
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[TokenId, ...]
    finish_reason: FinishReason
    stats: RequestStats
