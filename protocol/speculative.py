"""Speculative-decoding configuration: which drafters, how far ahead.

Strings as on the CLI: "none", or a "+"-joined set of drafters and options, e.g. "ngram+forced".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interlock.protocol.types import RequestId, TokenId

DRAFTERS = ("ngram", "forced")
OPTIONS = ("adaptive",)


@dataclass(frozen=True)
class NGramConfig:
    """Prompt-lookup drafting with TensorRT-LLM's NGram options.

    max_matching_ngram_size: longest suffix of the sequence looked up (tries shorter ones after);
    is_keep_all: keep every continuation seen for a key (else only the latest / oldest);
    is_use_oldest: with several continuations, propose the oldest (else the newest);
    is_public_pool: one pool shared by all requests (else one per request).
    """

    max_matching_ngram_size: int = 3
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = False

    def __post_init__(self) -> None:
        if self.max_matching_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be >= 1, got {self.max_matching_ngram_size}")


@dataclass(frozen=True)
class DraftRequest:
    """What a user-provided drafter sees of one request: its id and prompt + committed output."""

    request_id: RequestId
    tokens: tuple[TokenId, ...]


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafters propose tokens and at most how many per step (max_draft_len = K)."""

    drafters: tuple[str, ...] = ("ngram", "forced")
    max_draft_len: int = 3
    ngram: NGramConfig = NGramConfig()
    adaptive: bool = False          # per request, draft fewer lookup tokens after rejections
    # A user-provided drafter (drafters.base.Drafter): asked for drafts when the grammar forces none;
    # the longer of its draft and the n-gram draft is verified.
    user_drafter: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        unknown = [d for d in self.drafters if d not in DRAFTERS]
        if unknown:
            raise ValueError(f"unknown drafter(s) {unknown}; choose from {', '.join(DRAFTERS)}")
        if not self.drafters and self.user_drafter is None:
            raise ValueError("no drafters: use speculative=None to disable speculation")
        if not 1 <= self.max_draft_len <= 16:
            raise ValueError(f"max_draft_len must be in 1..16, got {self.max_draft_len}")

    @classmethod
    def parse(cls, text: str | None, *, max_draft_len: int = 3) -> SpeculativeConfig | None:
        """"none" / "" / None -> None; "ngram+forced+adaptive" -> drafters ngram, forced; adaptive on."""
        if text is None or text.strip().lower() in ("", "none"):
            return None
        parts = tuple(p.strip() for p in text.lower().split("+") if p.strip())
        drafters = tuple(p for p in parts if p not in OPTIONS)
        return cls(drafters=drafters, max_draft_len=max_draft_len, adaptive="adaptive" in parts)

    @property
    def label(self) -> str:
        return "+".join(self.drafters + (("adaptive",) if self.adaptive else ()))
