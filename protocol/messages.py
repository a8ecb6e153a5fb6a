"""The messages actors exchange, one frozen class per intent, and the snapshots a step is planned in.

A message exists where another task hands an actor something: the Engine's requests, compiled
grammars, cancels and queries (docs/architecture.md, "Messages", says why each one exists). The
Scheduler drives the other actors by calling them on the loop, so a step sends none: its plan, block
tables and outcome are frozen snapshots passed to the step program and back.

Snapshots carry ids, ints and tuples; big buffers (KV storage, bitmasks, logits) stay with the
actor that owns them and are shared read-only by reference, set up once when the runtime is wired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interlock.protocol.conditional import TrieView
from interlock.protocol.grammar import GrammarSpec
from interlock.protocol.sampling import SamplingParams, TokenLogprob
from interlock.protocol.types import BlockId, RequestId, SeqId, SlotId, TokenId


@dataclass(frozen=True)
class RequestSpec:
    """What the user asked for, tokenized and validated."""

    request_id: RequestId
    prompt: tuple[TokenId, ...]
    grammar: GrammarSpec | None
    sampling: SamplingParams
    uncond_prompt: tuple[TokenId, ...] | None = None   # CFG's companion prompt (sampling.guidance_scale set)
    trie: TrieView | None = None    # one attempt of a law="conditional" request: what earlier ones learned


# --- Scheduler inbox -------------------------------------------------------------------------

@dataclass(frozen=True)
class Submit:
    spec: RequestSpec
    stream: Any                    # streams.output.OutputStream[Delta]: the scheduler is its producer


@dataclass(frozen=True)
class GrammarReady:
    """The request's grammar compiled (compiled is set) or failed (error is set)."""

    request_id: RequestId
    compiled: Any = None
    error: BaseException | None = None
    compile_ms: float = 0.0


@dataclass(frozen=True)
class Cancel:
    request_id: RequestId


@dataclass(frozen=True)
class Wake:
    """A paused output stream has room again (its consumer took a delta); or a failure on the loop
    that the Scheduler's task must raise (Scheduler._fail)."""


# --- one step ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GuideChunk:
    """A CFG request's unconditional companion as one step sees it: its own KV sequence, fed at its
    own positions [start, start + len(chunk)). On a sampling step chunk is (last token,): the
    request's last output token, or the unconditional prompt's last token before any output; the
    verifier appends the request's drafts. On a prefill step it is the next chunk of the
    unconditional prompt, or () when only the conditional prompt is left to prefill."""

    seq: SeqId
    start: int
    chunk: tuple[TokenId, ...]


@dataclass(frozen=True)
class RequestSnapshot:
    """One request as one step sees it.

    chunk: the tokens this step feeds the model at positions [start, start + len(chunk)):
    a prefill chunk of the prompt, or (last token,) for a sampling step, which drafts extend.
    A prefill chunk is () when only a CFG request's companion is left to prefill.
    guide: the CFG companion's part of this step (None without guidance). Only the Scheduler,
    which plans it, and the VerifierActor, which feeds it and combines its logits, read it.
    """

    request_id: RequestId
    slot: SlotId
    seq: SeqId
    start: int
    chunk: tuple[TokenId, ...]
    sample: bool                   # this step samples (decode); False for a prefill chunk
    constrained: bool              # has a grammar (ready whenever sample is True)
    sampling: SamplingParams
    guide: GuideChunk | None = None
    trie: TrieView | None = None   # a law="conditional" attempt's (RequestSpec.trie); the VerifierActor reads it


@dataclass(frozen=True)
class BlockTables:
    """Read-only view of the KV block tables a step uses (what models.batch.build_batch needs)."""

    block_size: int
    tables: tuple[tuple[SeqId, tuple[BlockId, ...]], ...]

    def block_table(self, seq: SeqId) -> tuple[BlockId, ...]:
        for s, table in self.tables:
            if s == seq:
                return table
        raise KeyError(seq)


@dataclass(frozen=True)
class StepPlan:
    """One step, staged in every part's StepQueue before the step is enqueued on the lanes."""

    step: int
    snapshots: tuple[RequestSnapshot, ...]
    max_drafts: int                # draft tokens a request may bring (SpeculativeConfig.step_drafts); 0: none
    kv: BlockTables | None = None  # filled in by the Scheduler with what KVActor.reserve granted


@dataclass(frozen=True)
class SlotResult:
    request_id: RequestId
    slot: SlotId
    new_tokens: tuple[TokenId, ...]   # accepted drafts, then the one sampled token
    drafted: int
    accepted: int
    error: BaseException | None = None    # this request failed in this step (a RequestError); tokens ()
    logprobs: tuple[TokenLogprob, ...] | None = None   # one per new token (sampling.logprobs set)


@dataclass(frozen=True)
class TokenEvent:
    """A step's outcome; sampled snapshots only, in plan order."""

    step: int
    results: tuple[SlotResult, ...]
    exposed_grammar_s: float          # how long the model lane waited for this step's grammar lane (its masks)
    forward_s: float


# --- queries (the Engine's, for metrics and leak checks) ------------------------------------

@dataclass(frozen=True)
class KVUsage:
    """Replies (free blocks (cached ones included), total blocks, sequences, cached blocks)."""

    reply: Any


@dataclass(frozen=True)
class EngineMetrics:
    """Totals since the engine started (from the Scheduler)."""

    steps: int
    step_s: float                 # wall time of steps, launch -> TokenEvent handled
    forward_s: float
    exposed_grammar_s: float      # time the model lane waited for the grammar lane (masks; 0 on CUDA)
    output_tokens: int
    messages: int = 0             # actor messages (inbox sends), all actors: per request or query, none a step
    loop_wakeups: int = 0         # event-loop entries for steps: one launch + one token event each
    host_s: float = 0.0           # Scheduler time on the event loop handling token events and launching
    replayed_steps: int = 0       # steps enqueued by replaying a captured program (a CUDA graph on CUDA)
    eager_steps: int = 0          # steps enqueued op by op (shapes that are not captured, or not yet)
    captured_programs: int = 0    # programs captured so far: one per step shape
    failed_captures: int = 0      # captures that failed: that shape runs eagerly from then on
    prompt_tokens: int = 0        # prompt tokens of admitted requests (CFG companions included)
    cached_prompt_tokens: int = 0  # of those, found in the prefix cache (not prefilled)
    conditional_requests: int = 0  # law="conditional" requests that ended with an accepted output (the Engine's)
    conditional_attempts: int = 0  # attempts those and the failed ones drew, accepted ones included
    conditional_rejected_tokens: int = 0   # tokens the rejected attempts drew

    @property
    def messages_per_step(self) -> float:
        return self.messages / self.steps if self.steps else 0.0

    @property
    def wakeups_per_step(self) -> float:
        return self.loop_wakeups / self.steps if self.steps else 0.0

    @property
    def exposed_grammar_frac(self) -> float:
        return self.exposed_grammar_s / self.step_s if self.step_s else 0.0


@dataclass(frozen=True)
class GetMetrics:
    reply: Any


@dataclass(frozen=True)
class Count:
    """Ask an actor how many per-request resources it holds (Engine.resources: leak checks)."""

    reply: Any

