"""Output delivery: one request's tokens become text deltas on its output stream.

The Scheduler owns one `Output` per request and calls `emit` with each step's new tokens; `emit`
applies the stop rules (end of sequence, max_tokens, the context limit, stop strings), detokenizes
incrementally and queues deltas; before a constrained request ends with "stop" it checks the whole
delivered text against the grammar (grammars.validate: JSON parsed strictly and validated with
jsonschema, regex full match, choice membership), so no backend leniency reaches the user as a
finished document: an invalid one ends as "error" with the GrammarError in `invalid`; `flush` hands queued deltas
to the stream as far as it has room
(a slow consumer pauses its request instead of growing a queue without bound).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from interlock.grammars.switch import is_switch
from interlock.output.reasoning import ReasoningStream
from interlock.grammars.validate import validate_output
from interlock.logs import get_logger
from interlock.output.detokenize import IncrementalText
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Reasoning
from interlock.protocol.messages import RequestSpec
from interlock.protocol.sampling import Delta, RequestStats, SamplingParams, TokenLogprob
from interlock.protocol.types import FinishReason, TokenId
from interlock.output.stream import OutputStream

log = get_logger(__name__)


def cut_at_stop(tokens: list[TokenId], eos: frozenset[TokenId] | tuple[TokenId, ...], sampling: SamplingParams,
                *, keep_stop: bool) -> tuple[list[TokenId], bool]:
    """The end-of-sequence rule, in one place: tokens up to the first end-of-sequence token (kept
    when keep_stop, as the verifier does so the matcher sees it; dropped for the caller's output),
    and whether one was found. ignore_eos turns the rule off."""
    if sampling.ignore_eos:
        return tokens, False
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1] if keep_stop else tokens[:i], True
    return tokens, False


@dataclass
class Output:
    """One request's output side: tokens so far, text state, queued deltas and its statistics."""

    spec: RequestSpec
    stream: OutputStream[Delta]
    text: IncrementalText
    submitted: float
    output: list[TokenId] = field(default_factory=list)
    pending: deque[Delta] = field(default_factory=deque)
    steps: int = 0
    step_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    exposed_s: float = 0.0
    compile_ms: float = 0.0
    first_token: float = 0.0
    invalid: GrammarError | None = None          # the end-of-request check refused the output
    thinking: ReasoningStream | None = None      # a Reasoning grammar: splits thinking from answer
    cached_prompt_tokens: int = 0       # prompt positions found in the prefix cache (CFG companion's too)

    @classmethod
    def new(cls, spec: RequestSpec, stream: OutputStream[Delta], tokenizer: Tokenizer) -> Output:
        out = cls(spec, stream, IncrementalText(tokenizer, spec.sampling.stop), time.perf_counter())
        if isinstance(spec.grammar, Reasoning):
            out.thinking = ReasoningStream(tokenizer, spec.grammar.start, spec.grammar.end)
        return out

    def emit(self, tokens: list[TokenId], eos: tuple[TokenId, ...], at_context_limit: bool,
             logprobs: tuple[TokenLogprob, ...] | None = None) -> FinishReason | None:
        """Queue a step's new tokens as a delta; the finish reason if the request ends here.
        logprobs (one per token, when the request asked) are cut with the tokens."""
        if not self.output and tokens:
            self.first_token = time.perf_counter()
        sampling = self.spec.sampling
        tokens, stopped = cut_at_stop(tokens, eos, sampling, keep_stop=False)
        reason: FinishReason | None = "stop" if stopped else None
        room = sampling.max_tokens - len(self.output)
        if len(tokens) >= room:
            # "length" even when a stop token follows the last one that fits: one token at a time,
            # the request ends at max_tokens before that stop token is drawn (speculation must not
            # change the finish reason either)
            tokens, reason = tokens[:room], "length"
        self.output.extend(tokens)
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]      # tokens only ever lose a tail above
        if reason is None and at_context_limit:
            reason = "length"
        text = self.text.push(tokens, final=reason is not None)
        if self.text.stop_hit:
            reason = "stop"
        if reason == "stop" and self.spec.grammar is not None and self._refused():
            return "error"                        # never a silent invalid document
        thought = ""
        if self.thinking is not None:
            thought, text = self.thinking.feed(tokens, text, final=reason is not None)
        self.pending.append(Delta(text, tuple(tokens), reason, self.stats() if reason is not None else None,
                                  reasoning_text=thought, logprobs=logprobs))
        return reason

    def _refused(self) -> bool:
        """Run the end-of-request check on everything delivered; keep its error in `invalid`."""
        grammar = self.spec.grammar
        if grammar is None:
            return False                          # nothing to check an unconstrained output against
        delivered = self.text.tokenizer.decode(self.text.ids, skip_special_tokens=True)[: self.text.emitted]
        if is_switch(grammar):
            # Its markers may be special tokens, which the delivered text drops: check the tokens' text.
            delivered = self.text.tokenizer.decode(self.output)
        try:
            validate_output(grammar, delivered)
        except GrammarError as exc:
            log.error("invalid_constrained_output", request_id=self.spec.request_id,
                      grammar=type(self.spec.grammar).__name__, error=str(exc), output=delivered[:200])
            self.invalid = exc
            return True
        return False

    def flush(self) -> None:
        """Hand queued deltas to the stream while it has room; the last one finishes it."""
        while self.pending and self.stream.try_put(self.pending[0]):
            delta = self.pending.popleft()
            if delta.finish_reason is not None:
                self.stream.finish()

    def stats(self) -> RequestStats:
        now = time.perf_counter()
        return RequestStats(
            prompt_tokens=len(self.spec.prompt), output_tokens=len(self.output), steps=self.steps,
            step_tokens=self.step_tokens, drafted=self.drafted, accepted=self.accepted,
            ttft_s=(self.first_token or now) - self.submitted, elapsed_s=now - self.submitted,
            exposed_grammar_ms=self.exposed_s * 1e3, grammar_compile_ms=self.compile_ms,
            cached_prompt_tokens=self.cached_prompt_tokens)
