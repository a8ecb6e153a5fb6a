"""Speculative-decoding configuration: which drafters, how far ahead.

Strings as on the CLI: "none", or a "+"-joined set of drafters and options, e.g. "ngram+forced",
"suffix+forced", "self-draft+forced", "draft:/path/to/model+forced+adaptive", "self-draft:6+nomask",
"ngram+forced:0" (forced tokens count against the draft length).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interlock.protocol.types import RequestId, TokenId

DRAFTERS = ("ngram", "suffix", "forced", "self-draft", "draft")
OPTIONS = ("adaptive", "nomask")
# Layers of the target the self-draft runs when none are named, chosen from data: on JME (10 rows,
# greedy, K=3, self-draft:N+forced) SmolLM2-135M's acceptance length is flat from N=4 to N=16
# (1.56-1.57; 2.0 at 24, 2.8 at 29, 4.0 at 30) while the cost per draft grows with N, so the
# cheapest depth wins (issue 12's runs, in git history: the README of 2026-11-21).
SELF_DRAFT_LAYERS = 4
# The most lookup tokens one step may verify for a request (K, and the suffix drafter's long drafts).
MAX_DRAFT_LEN = 16
# K when none is named: lookup tokens a step verifies beyond the forced ones. Every default K in
# the project (SpeculativeConfig, parse, Engine.from_pretrained, the CLI) is this one.
DEFAULT_DRAFT_LEN = 3
# The drafters when none are named (the CLI, the server, Engine.from_pretrained).
DEFAULT_SPECULATIVE = "ngram+forced"


@dataclass(frozen=True)
class NGramConfig:
    """Prompt-lookup drafting with TensorRT-LLM's NGram options.

    max_matching_ngram_size: longest suffix of the sequence looked up (tries shorter ones after);
    is_keep_all: keep every continuation seen for a key (else only the latest / oldest);
    is_use_oldest: with several continuations, propose the oldest (else the newest);
    is_public_pool: one pool shared by all requests (else one per request).

    Default N = 8: on structured output a long match is the specific one (a key's whole context,
    not just `":"`). Measured with ngram+forced, K = 3, first 50 rows: acceptance length 2.66 -> 2.83
    on JME and 2.79 -> 2.82 on Glaiveai2K against N = 3 (interlock bench, 2026-11-25).
    """

    max_matching_ngram_size: int = 8
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = False

    def __post_init__(self) -> None:
        if self.max_matching_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be >= 1, got {self.max_matching_ngram_size}")


@dataclass(frozen=True)
class SuffixConfig:
    """max_depth D: longest indexed substring (a match and the draft below it fit in D tokens).
    max_spec_factor: within K (the step's lookup budget), draft at most ceil(factor * m) tokens after
    an m-token match. max_long_draft: beyond K, draft at most m tokens after an m-token match, up to
    this many (SuffixDecoding's rule, a draft no longer than the evidence it continues; 0: K caps
    every draft). min_token_prob: stop drafting once the path probability falls below it.
    max_global_tokens: tokens the global trie keeps, finished outputs with the last D tokens of their
    prompts (oldest evicted first; 0 turns the global trie off).

    Defaults measured with suffix+forced, K = 3, in the engine (greedy, one request at a time):
    max_spec_factor 1 -> 3 (a 1-token match may draft all K) took acceptance 2.53 -> 2.84 on 20
    repeated-schema documents and 2.81 -> 3.13 on 30 JME rows (ngram+forced: 2.62 and 3.11).
    Long drafts (max_long_draft 12, which needs D = 24 for a 12-token match with 12 below it): a
    prompt seen before (the same JME row run again, its output in the global trie) takes
    acceptance 4.1 -> ~12 while new prompts keep theirs; K = 16 for every draft instead made
    the repeated-schema documents slower (values differ per document, and a 3-token match on a key
    drafted another document's value 16 tokens long). Runs of issue 13, recorded in git history.
    """

    max_depth: int = 24
    max_spec_factor: float = 3.0
    max_long_draft: int = 12
    min_token_prob: float = 0.1
    max_global_tokens: int = 50_000

    def __post_init__(self) -> None:
        if self.max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {self.max_depth}")
        if not self.max_spec_factor > 0:
            raise ValueError(f"max_spec_factor must be > 0, got {self.max_spec_factor}")
        if not 0 <= self.max_long_draft <= MAX_DRAFT_LEN:
            raise ValueError(f"max_long_draft must be in 0..{MAX_DRAFT_LEN}, got {self.max_long_draft}")
        if not 0 <= self.min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if self.max_global_tokens < 0:
            raise ValueError(f"max_global_tokens must be >= 0, got {self.max_global_tokens}")


@dataclass(frozen=True)
class DraftRequest:
    """What a drafter sees of one request in a step (drafters/base.py).

    tokens: the prompt + committed output, which the draft continues. Filled only for drafters that
    keep no per-request state of their own (no `drafters.base.Tracked` hooks); () for the ones that
    do, which learn every committed token through `add`/`commit` (copying it each step is waste).
    forced: the grammar's forced next tokens (up to the step's K; () when none or when "forced" is
    not a drafter). They are the only tokens the grammar allows there, so a draft that disagrees
    with one is cut at that token; a drafter may continue past them by returning them first.
    """

    request_id: RequestId
    tokens: tuple[TokenId, ...]
    forced: tuple[TokenId, ...] = ()


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafters propose tokens and at most how many per step (max_draft_len = K)."""

    drafters: tuple[str, ...] = ("ngram", "forced")
    max_draft_len: int = DEFAULT_DRAFT_LEN
    # Grammar-forced tokens are certain, so they need no draft budget, only rows: a step may carry
    # up to K + forced_extra draft tokens when forced ones lead, and the other drafters still get K
    # after them (jump-forward riding in the verify step). A forced row always yields a token for
    # ~1 ms of a 2-core CPU's ~8 ms step. JME 50, K = 3 (interlock bench, 2026-11-25): acceptance 2.81 / 3.09 / 3.15 at
    # 0 / 2 / 4, tokens/s 1.00 / 1.01 / 1.02x. 0: forced tokens count against K (TensorRT-LLM's way).
    forced_extra: int = 4
    ngram: NGramConfig = NGramConfig()
    suffix: SuffixConfig = SuffixConfig()
    adaptive: bool = False          # per request, draft fewer lookup tokens after rejections
    # A user-provided drafter (drafters.base.Drafter), last in the chain: the longest draft of all
    # the drafters is verified (drafters/chain.py).
    user_drafter: Any = field(default=None, compare=False)
    # Draft models ("self-draft" / "draft"): how many target layers the self-draft runs, which
    # checkpoint "draft" loads, and whether the grammar masks the draft's logits (draft-side masking;
    # off = TensorRT-LLM's "w/o draft" ablation). draft_lm: a ready drafters.model.DraftLM (e.g. with
    # a pruned d2t vocabulary), used for "draft" instead of loading draft_model.
    self_draft_layers: int = SELF_DRAFT_LAYERS
    draft_model: str | None = None
    draft_masking: bool = True
    draft_lm: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        unknown = [d for d in self.drafters if d not in DRAFTERS]
        if unknown:
            raise ValueError(f"unknown drafter(s) {unknown}; choose from {', '.join(DRAFTERS)}, draft:PATH")
        if not self.drafters and self.user_drafter is None:
            raise ValueError("no drafters: use speculative=None to disable speculation")
        if not 1 <= self.max_draft_len <= MAX_DRAFT_LEN:
            raise ValueError(f"max_draft_len must be in 1..{MAX_DRAFT_LEN}, got {self.max_draft_len}")
        if not 0 <= self.forced_extra <= 16:
            raise ValueError(f"forced_extra must be in 0..16, got {self.forced_extra}")
        if "self-draft" in self.drafters and "draft" in self.drafters:
            raise ValueError("choose one draft model: self-draft or draft:PATH")
        if "draft" in self.drafters and self.draft_model is None and self.draft_lm is None:
            raise ValueError("the draft drafter needs a model: draft:PATH (or draft_model=...)")
        if self.self_draft_layers < 1:
            raise ValueError(f"self_draft_layers must be >= 1, got {self.self_draft_layers}")

    @classmethod
    def parse(cls, text: str | None, *, max_draft_len: int = DEFAULT_DRAFT_LEN,
              **fields: Any) -> SpeculativeConfig | None:
        """"none" / "" / None -> None; "ngram+forced+adaptive" -> drafters ngram, forced; adaptive on;
        "ngram:3" -> n-gram lookup of suffixes up to 3 tokens; "self-draft:6" -> the self-draft over
        6 layers; "draft:PATH" -> a draft checkpoint; "forced:N" -> forced tokens take up to N rows
        beyond K (forced_extra)."""
        if text is None or text.strip().lower() in ("", "none"):
            return None
        drafters: list[str] = []
        options: dict[str, Any] = {}
        for part in (p.strip() for p in text.split("+")):
            name, _, arg = part.partition(":")
            name = name.lower()
            if name in OPTIONS and arg:
                raise ValueError(f"{name} takes no argument (got {part!r})")
            if not part or name in OPTIONS:
                continue
            if name == "draft":
                if not arg:
                    raise ValueError("draft needs a path or model name: draft:PATH")
                options["draft_model"] = arg
            elif name == "self-draft" and arg:
                if not arg.isdigit():
                    raise ValueError(f"self-draft:N needs a number of layers, got {arg!r}")
                options["self_draft_layers"] = int(arg)
            elif name == "ngram" and arg:
                if not arg.isdigit() or int(arg) < 1:
                    raise ValueError(f"ngram:N needs the longest suffix to look up (>= 1), got {arg!r}")
                options["ngram"] = NGramConfig(max_matching_ngram_size=int(arg))
            elif name == "forced" and arg:
                if not arg.isdigit():
                    raise ValueError(f"forced:N needs the rows forced tokens may take beyond the draft length, "
                                     f"got {arg!r}")
                options["forced_extra"] = int(arg)
            elif arg:
                raise ValueError(f"{name} takes no argument (got {part!r})")
            drafters.append(name)
        parts = {p.strip().lower() for p in text.split("+")}
        return cls(drafters=tuple(drafters), max_draft_len=max_draft_len, adaptive="adaptive" in parts,
                   draft_masking="nomask" not in parts, **(options | fields))

    @property
    def step_drafts(self) -> int:
        """The most draft tokens one step gives a request: K (or the suffix drafter's long drafts),
        plus forced_extra rows that only forced tokens fill (drafters/chain.py). What the step's
        rows, masks and KV are sized by."""
        return self.lookup_drafts + (self.forced_extra if "forced" in self.drafters else 0)

    @property
    def lookup_drafts(self) -> int:
        """The most lookup tokens one step gives a request: K, or longer suffix drafts (whose match
        and draft share the trie's depth, so none is longer than half of it)."""
        long = min(self.suffix.max_long_draft, self.suffix.max_depth // 2) if "suffix" in self.drafters else 0
        return max(self.max_draft_len, long)

    @property
    def uses_draft_model(self) -> bool:
        return "self-draft" in self.drafters or "draft" in self.drafters

    @property
    def label(self) -> str:
        names = [f"self-draft:{self.self_draft_layers}" if d == "self-draft" else
                 f"ngram:{self.ngram.max_matching_ngram_size}" if d == "ngram"
                 and self.ngram.max_matching_ngram_size != NGramConfig().max_matching_ngram_size else
                 f"draft:{self.draft_model or 'custom'}" if d == "draft" else
                 f"forced:{self.forced_extra}" if d == "forced" and self.forced_extra != SpeculativeConfig.forced_extra
                 else d for d in self.drafters]
        return "+".join(names + (["adaptive"] if self.adaptive else []) + ([] if self.draft_masking else ["nomask"]))
