"""VerifierActor: owns the target model and the sampling state; its part of a step runs on the model lane.

Its part of a step (see actors/step/program.py): in the prologue, the step's plan and each sampling
request's drafts and generator (`begin`, `stage`); on the model lane, the target forward over
every request's chunk (prefill chunks, or the last token plus drafts), then, after the mask event,
masking and verification (`verify`), which writes each request's SlotResult into the step
buffers before the token event is recorded. The acceptance law is kernels/verify.py's
`verify_step`, the device runner's own, called on the requests' packed rows [B, K+1] (each
reading its lane's mask rows); `_settle` turns its outputs into results for both runners.

A per-request fault inside verification (a NaN logits row, or a row that allows no token at all)
fails that request with a SamplingError; its neighbours are verified exactly as without it.

Classifier-free guidance: a request's companion (snapshot.guide) is fed in the same packed forward,
right after the request's own chunk, with the same tokens and drafts at its own positions; its rows
take the same row path, so they are what a forward of the companion alone would give. Before the
padded-id, grammar and top-k/top-p masks and before verification, the request's K+1 rows become
uncond + s * (cond - uncond): drafts are verified against the guided, masked distribution.

Greedy requests with nothing but a grammar to apply (no penalties, guidance or logprobs) take a
lean path when the native kernels built: one pass per row finds the largest logit its grammar row
allows (kernels/csrc/argmax.h), and acceptance compares those ids with the drafts. It decides what
the general path decides (the masked argmax, lowest id on ties; a used row with a NaN or nothing
allowed fails its request) without masking, copying or re-reading the logits. On a model with the
native int8 head (`sparse_head`), such a step's forward stops before the head, and after the mask
event `head_argmax` computes, for a row whose grammar allows few ids (JSON structure, an enum, the
row after a forced token), only those logits, the same bits the dense head gives them; rows that
allow many take the dense head together, rows past a refused draft none. The native pass is a
backend of kernels/verify.py's law, not a second one: its ids and peaks, laid out [B, K+1], go to
`verify_greedy`, which decides the moot drafts and the acceptance as verify_step's greedy mode
does (tests/engine/test_exactness_modes.py holds the two paths to the same tokens and stats).

The grammar-conditional law (SamplingParams.law "conditional", one attempt per internal request
that carries a TrieView): such a request's rows are not masked. Its target is the model's law on
the unmasked rows, reweighted by what earlier attempts learned (kernels/walk_book.py,
kernels/conditional.py); drafts (point masses and a draft model's q alike, grammar-forced ones
included, which now carry the model's probability) are verified against that target by the same
rejection rule, and the first emitted token the grammar's row refuses fails the request with an
AttemptRefused carrying what the attempt saw (engine/conditional.py starts the next attempt).

Log-probabilities (SamplingParams.logprobs): for the requests that ask, and only for them, each
emitted token's log-probability and its row's top alternatives are read from the very rows it was
verified against (kernels/logprobs.py), so they are the same with or without speculation.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from interlock.actors.framework.base import Actor, Handler
from interlock.output.delivery import cut_at_stop
from interlock.actors.grammar_actor import MaskBuffers
from interlock.kernels.penalty_book import PenaltyBook
from interlock.kernels.walk_book import WalkBook
from interlock.actors.step.program import StepShape
from interlock.actors.step.state import StepState
from interlock.kernels import native, token_logprobs
from interlock.kernels.cfg import cfg_combine
from interlock.kernels.sampling import request_generator
from interlock.kernels.verify import (
    MaskInputs, Target, VerifyInputs, VerifyOutputs, allowed_ids, sampling_mode, valid_drafts, verify_greedy,
    verify_step,
)
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import Transformer
from interlock.protocol.errors import SamplingError
from interlock.protocol.messages import Count, RequestSnapshot, SlotResult, StepPlan
from interlock.protocol.sampling import TokenLogprob
from interlock.protocol.types import RequestId, TokenId
from interlock.streams.timeline import Timeline
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass
class _StepWork:
    """What one step's model-lane functions share."""

    plan: StepPlan
    sampled: list[int]                          # indices into plan.snapshots that sample
    drafts: list[tuple[TokenId, ...]]           # per sampled snapshot
    probs: list[torch.Tensor | None]            # per sampled snapshot
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None          # the lean head's rows: logits wait for the masks
    forward_end: float = 0.0

    def forward_logits(self) -> torch.Tensor:
        """The forward's logits, where the lean head did not run: a step that samples feeds every
        sampled request, so its forward wrote one of `hidden` and `logits`."""
        assert self.logits is not None, "read only where hidden is None in a step that samples"
        return self.logits


class VerifierActor(Actor[object]):
    def __init__(self, model: Transformer, kv: PagedKVCache, timeline: Timeline, buffers: MaskBuffers,
                 step: StepState, tokenizer_vocab: int, eos_token_ids: tuple[int, ...], *,
                 rows_prefill: bool | None = None, lean: bool | None = None) -> None:
        self.model = model
        self.rows_prefill = rows_prefill    # this engine's prompt path (EngineConfig.prefill); None: the model's
        self.kv = kv
        self.timeline = timeline
        self.buffers = buffers
        self.step = step
        self.tokenizer_vocab = tokenizer_vocab
        self.eos = frozenset(eos_token_ids)
        self.generators: dict[RequestId, torch.Generator] = {}     # seeded requests' own
        self.penalties = PenaltyBook(len(step), model.config.vocab_size)   # per-request token counts
        self.walks = WalkBook(eos_token_ids)                        # law="conditional" attempts' walks
        self._plan: StepPlan | None = None
        self._work: _StepWork | None = None
        # the lean greedy path (module docstring); None: where the native kernels build
        self.lean = native.available() if lean is None else lean
        super().__init__("verifier")

    def handlers(self) -> Mapping[type, Handler]:
        return {Count: self.on_count}

    async def on_count(self, msg: Count) -> None:
        """(seeded generators, penalty entries, conditional walks) for leak checks."""
        msg.reply.set_result((len(self.generators), len(self.penalties), len(self.walks)))

    # --- the Scheduler's calls (on the loop; they take effect between steps) ----------------------

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        """A penalized request's prompt (the Scheduler calls this for those only): its penalty entry.
        Generators and walks start on the request's first step."""
        self.step.between_steps(self.penalties.add, request_id, prompt)

    def release(self, request_id: RequestId) -> None:
        self.step.between_steps(self._release, request_id)

    def _release(self, request_id: RequestId) -> None:
        self.generators.pop(request_id, None)
        self.penalties.release(request_id)
        self.walks.release(request_id)

    # --- this actor's part of a step ----------------------------------------------------------

    fixed_rows = False      # the forward computes only the drafts the grammar's check let through

    def shape_of(self, plan: StepPlan) -> StepShape | None:
        """None: this runner's ops read everything from the plan (actors/step/program.py)."""
        return None

    def begin(self, plan: StepPlan) -> None:
        """Prologue: the step's plan."""
        self._plan = plan

    def stage(self) -> None:
        """The drafts and q the drafter wrote (and the grammar cut); the requests' generators."""
        plan = self._plan
        assert plan is not None
        b = self.step
        sampled = [i for i, s in enumerate(plan.snapshots) if s.sample and b[s.slot].error is None]
        for s in plan.snapshots:
            b[s.slot].result = None
        for i in sampled:               # seeded per request, drawn in request order: batch-independent
            self._generator(plan.snapshots[i])
        slots = [plan.snapshots[i].slot for i in sampled]
        self._work = _StepWork(plan, sampled, [b[slot].drafts for slot in slots], [b[slot].probs for slot in slots])

    def forward(self, shape: StepShape | None = None) -> None:
        work = self._work
        assert work is not None
        plan = work.plan
        drafts = dict(zip(work.sampled, work.drafts))
        chunks = []
        for i, s in enumerate(plan.snapshots):
            if s.sample and i not in drafts:
                continue                # failed earlier in this step: not fed (its request ends)
            d = drafts.get(i, ())
            tokens = s.chunk + d
            rows = tuple(range(len(tokens))) if s.sample else ()
            if tokens:                  # () when only the CFG companion still prefills
                chunks.append(SeqChunk(s.seq, tokens, s.start, rows))
            if s.guide is not None and s.guide.chunk:
                chunks.append(SeqChunk(s.guide.seq, s.guide.chunk + d, s.guide.start, rows))
        start = time.perf_counter()
        batch = None
        if chunks:
            assert plan.kv is not None, "the Scheduler fills a launched step's blocks (StepPlan.kv)"
            batch = build_batch(chunks, plan.kv, all_rows=self.rows_prefill)
        if batch is not None and self._lean_head(work):
            work.hidden = self.model.final_hidden(batch, self.kv)           # [sum(1+n_i), E]
        elif batch is not None:
            work.logits = self.model(batch, self.kv)                        # [sum(1+n_i) (x2 CFG), V]
        work.forward_end = time.perf_counter()
        self.step.timing["forward_s"] = work.forward_end - start

    def verify(self, shape: StepShape | None = None) -> None:
        """Mask and verify every sampled request; write its SlotResult (or its SamplingError)."""
        work = self._work
        assert work is not None
        if work.sampled:
            self._verify(work)
        self._work = None

    def finish(self) -> None:
        """Nothing: `verify` wrote the results (the device runner copies them back first)."""

    def _lean(self, snaps: list[RequestSnapshot]) -> bool:
        """Greedy verification from the allowed argmax alone fits these requests (module docstring)."""
        return self.lean and all(s.sampling.greedy and s.guide is None and not s.sampling.penalized
                                 and s.sampling.logprobs is None for s in snaps)

    def _lean_head(self, work: _StepWork) -> bool:
        """The step's logits can wait for the masks, which say which of them the lean path reads:
        the model's head_argmax computes only those (module docstring)."""
        return (bool(work.sampled) and getattr(self.model, "sparse_head", False)
                and self._lean([work.plan.snapshots[i] for i in work.sampled]))

    def _verify(self, work: _StepWork) -> None:
        """The step's verification: kernels/verify.py's law on the requests' rows, packed [B, K+1]."""
        plan = work.plan
        snaps = [plan.snapshots[i] for i in work.sampled]
        if work.hidden is not None or (self._lean(snaps) and work.forward_logits().dtype == torch.float32):
            self._verify_greedy(work, snaps)
            return
        k = max(len(d) for d in work.drafts)
        v, m = self._inputs(snaps, work.drafts, k)
        logits = self._rows(work, snaps, k)                                 # [B, K+1, V] float32
        self.penalties.apply_(logits, snaps, v.drafts, valid_drafts(v, m))   # after CFG, before the masks
        laws: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}            # row -> (model's p, stop ruled)
        vocab = logits.shape[2]
        mode = sampling_mode([s.sampling for s in snaps])
        out = verify_step(logits.view(-1, vocab), v, m, self.tokenizer_vocab, mode, self._draft_probs(work, vocab, k),
                          target=self._conditional(snaps, work.drafts, v, m, laws),
                          mask_backend="torch")                               # masks `logits` in place
        asked = [(row, r) for row, r in self._settle_all(snaps, out, laws) if snaps[row].sampling.logprobs is not None]
        if asked:
            for r in self._with_logprobs(logits, snaps, asked):
                self.step[r.slot].result = r

    def _inputs(self, snaps: list[RequestSnapshot], drafts: list[tuple[TokenId, ...]],
                k: int) -> tuple[VerifyInputs, MaskInputs]:
        """The requests' verification inputs, request b's K+1 verify rows reading its lane's mask
        rows lane * (D+1) + j; the sampled ones' uniforms drawn from their generators. Few tensor
        calls (each costs microseconds on the hot step): one per kind of value, not per request."""
        b, per = len(snaps), self.buffers.rows_per_slot
        d = torch.tensor([list(ds) + [0] * (k - len(ds)) for ds in drafts], dtype=torch.long).view(b, k)
        ints = torch.tensor([(len(ds), s.constrained, self.step[s.slot].lane, s.trie is not None)
                             for s, ds in zip(snaps, drafts)], dtype=torch.long)          # [B, 4]
        p = [s.sampling for s in snaps]
        if all(x.greedy for x in p):          # greedy: the sampling fields are never read (zeros: off)
            zeros = torch.zeros(b, k + 2)
            temperature, top_k, top_p, uniforms = zeros[:, 0], ints[:, 0] * 0, zeros[:, 0] + 1, zeros[:, 1:]
        else:
            temperature = torch.tensor([x.temperature for x in p], dtype=torch.float32)
            top_k = torch.tensor([x.top_k or 0 for x in p], dtype=torch.long)
            top_p = torch.tensor([x.top_p or 1.0 for x in p], dtype=torch.float32)
            uniforms = self._uniforms(snaps, k)
        v = VerifyInputs(d, ints[:, 0], ints[:, 1].bool(), temperature, top_k, top_p, uniforms)
        lanes = ints[:, 2]
        rows = (lanes.unsqueeze(1) * per + torch.arange(k + 1)).view(-1)               # [B (K+1)]
        trie = ints[:, 3].bool() if any(s.trie is not None for s in snaps) else None
        return v, MaskInputs(self.buffers.bitmask, self.buffers.rows[lanes], self.buffers.free[rows], rows, trie)

    def _rows(self, work: _StepWork, snaps: list[RequestSnapshot], k: int) -> torch.Tensor:
        """The forward's rows packed per request [B, K+1, V] float32 (padding unused), guided ones
        combined with their companion's (module docstring)."""
        flat = work.forward_logits()                                    # [sum(1+n_i) (x2 CFG), V]
        v = flat.shape[1]
        logits = flat.new_zeros((len(snaps), k + 1, v), dtype=torch.float32)
        offset = 0
        for row, (s, drafts) in enumerate(zip(snaps, work.drafts)):
            n = len(drafts)
            logits[row, : n + 1] = flat[offset: offset + n + 1]
            offset += n + 1
            if s.guide is not None:
                logits[row, : n + 1] = self._guided(logits[row, : n + 1], flat[offset: offset + n + 1],
                                                    s.sampling.guidance_scale)
                offset += n + 1
        return logits

    def _verify_greedy(self, work: _StepWork, snaps: list[RequestSnapshot]) -> None:
        """Greedy verification from each row's allowed argmax (module docstring): the native pass
        finds it over the packed rows, kernels/verify.py's `verify_greedy` decides from it."""
        widths = [len(d) + 1 for d in work.drafts]
        if work.hidden is not None:       # rows the verification below never reads are skipped (-2)
            mask_rows = torch.tensor(self._mask_rows(snaps, widths, unread=-2), dtype=torch.long)
            ids, peaks = self.model.head_argmax(work.hidden, self.buffers.bitmask, mask_rows, self.tokenizer_vocab)
        else:
            ids, peaks = native.masked_argmax(work.forward_logits().contiguous(), self.buffers.bitmask,
                                              torch.tensor(self._mask_rows(snaps, widths), dtype=torch.long),
                                              self.tokenizer_vocab)
        k = max(widths) - 1
        filled = self.buffers.rows.tolist()
        # one tensor call for the law's inputs (each call costs microseconds on this hot path)
        ints = torch.tensor([(len(d), s.constrained, filled[self.step[s.slot].lane], *d, *[0] * (k - len(d)))
                             for s, d in zip(snaps, work.drafts)], dtype=torch.long)          # [B, 3 + K]
        best, peaks = _padded(ids, widths, k + 1), _padded(peaks, widths, k + 1)      # [B, K+1] each
        out = verify_greedy(best, peaks, ints[:, 3:], ints[:, 0], ints[:, 1].bool(), ints[:, 2])
        self._settle_all(snaps, out, {})

    def _settle_all(self, snaps: list[RequestSnapshot], out: VerifyOutputs,
                    laws: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[int, SlotResult]]:
        """Every request's result from the verification's outputs (`_settle`), its tokens counted
        for its penalties; (row, result) of those that stand."""
        tokens, accepted = out.tokens.tolist(), out.accepted.tolist()
        valid, peaks = out.valid_drafts.tolist(), out.peaks.tolist()
        done = []
        for row, s in enumerate(snaps):
            n = accepted[row]
            result = self._settle(s, tokens[row][: n + 1], peaks[row], valid[row], n, laws.get(row))
            if result is not None:
                done.append((row, result))
        self.penalties.commit([r for _, r in done])
        return done

    def _generator(self, s: RequestSnapshot) -> torch.Generator | None:
        """A sampling request's own generator, made from its seed on its first step (None: greedy)."""
        if s.sampling.greedy:
            return None
        if s.request_id not in self.generators:
            self.generators[s.request_id] = request_generator(s.sampling.seed)
        return self.generators[s.request_id]

    def _settle(self, s: RequestSnapshot, tokens: list[int], peaks: list[float], drafted: int, accepted: int,
                law: tuple[torch.Tensor, torch.Tensor] | None = None) -> SlotResult | None:
        """A verified request's step result: its accepted drafts and new token, up to a stop token
        (kept: nothing after it, the grammar refuses that), written to its slot; None (and its
        error) when a row its tokens came from was invalid, or when its conditional attempt's
        `law` (the model's p and the rows whose stop was ruled) refuses a token."""
        tokens, _ = cut_at_stop(tokens, self.eos, s.sampling, keep_stop=True)
        if self._row_invalid(s, peaks[: len(tokens)]):
            return None
        refused = self.walks.settle(s, tokens, *law) if law is not None else None
        if refused is not None:             # the attempt is a rejection: its request ends here
            self.step.fail(s.slot, refused)
            return None
        # A stop token that was an accepted draft counts as accepted (tokens end at it).
        result = SlotResult(s.request_id, s.slot, tuple(tokens), drafted, min(accepted, len(tokens)))
        self.step[s.slot].result = result
        return result

    @staticmethod
    def _with_logprobs(logits: torch.Tensor, snaps: list[RequestSnapshot],
                       asked: list[tuple[int, SlotResult]]) -> list[SlotResult]:
        """Each result with its tokens' log-probabilities, from the rows they were verified against
        (masked, penalized, guided: `logits` [B, K+1, V] as verification used them). One batched
        call for the requests that asked; nothing for the others."""
        lengths = torch.tensor([len(r.new_tokens) for _, r in asked])
        params = [snaps[row].sampling for row, _ in asked]
        x = torch.cat([logits[row, : len(r.new_tokens)] for row, r in asked])            # [R, V]
        tokens = torch.tensor([t for _, r in asked for t in r.new_tokens], dtype=torch.long)
        per_row = lambda values, dtype: torch.tensor(values, dtype=dtype).repeat_interleave(lengths)  # noqa: E731
        temp = per_row([p.temperature for p in params], torch.float32)
        top_k = per_row([p.top_k or 0 for p in params], torch.long) if any(p.top_k for p in params) else None
        top_p = per_row([p.top_p or 1.0 for p in params], torch.float32) if any(p.top_p for p in params) else None
        n = max(p.logprobs or 0 for p in params)
        out = token_logprobs(x, tokens, temp, top_k, top_p, n=n)
        token, ids, top = out.token.tolist(), out.top_ids.tolist(), out.top.tolist()
        results, i = [], 0
        for (_, r), p in zip(asked, params):
            used = len(r.new_tokens)
            entries = map(TokenLogprob.from_row, r.new_tokens, token[i: i + used], ids[i: i + used],
                          top[i: i + used], [p.logprobs or 0] * used)
            results.append(replace(r, logprobs=tuple(entries)))
            i += used
        return results

    def _mask_rows(self, snaps: list[RequestSnapshot], widths: list[int], unread: int = -1) -> list[int]:
        """The bitmask row each logits row reads (widths[i] rows for snaps[i]: row j of a constrained
        request reads lane * (D+1) + j), -1 for none: free rows (a switching grammar outside its
        constrained part) were left unwritten, which is exact (they would allow every id). Rows past
        the ones the grammar filled (after a refused draft, or padding) are never read: `unread`."""
        per = self.buffers.rows_per_slot
        filled, free = self.buffers.rows.tolist(), self.buffers.free.tolist()
        out: list[int] = []
        for s, width in zip(snaps, widths):
            if not s.constrained:
                out.extend([-1] * width)
                continue
            lane = self.step[s.slot].lane
            n = filled[lane]
            out.extend(unread if j >= n else -1 if free[lane * per + j] else lane * per + j for j in range(width))
        return out

    def _row_invalid(self, s: RequestSnapshot, peaks: list[float]) -> bool:
        """True (and the request fails alone, SamplingError) when a logits row its tokens were drawn
        from had a NaN or allowed no token: `peaks`, each used row's largest allowed logit, is NaN if
        any allowed logit is and -inf if none is allowed. Rows are independent: its neighbours' results stand."""
        if any(math.isnan(p) for p in peaks):
            self._fail_row(s, "a NaN logit")
        elif any(p == -math.inf for p in peaks):
            self._fail_row(s, "no allowed token")
        else:
            return False
        return True

    def _fail_row(self, s: RequestSnapshot, what: str) -> None:
        log.error("sampling_row_invalid", request_id=s.request_id, problem=what,
                  step=self._work.plan.step if self._work else None)
        self.step.fail(s.slot, SamplingError(f"request {s.request_id}: its logits row has {what}"))

    @staticmethod
    def _guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float | None) -> torch.Tensor:
        """One request's guided rows [n+1, V] = uncond + s * (cond - uncond)."""
        if scale is None or scale == 1.0:
            # u + 1 * (c - u) is c only up to rounding (c - u rounds), and s = 1 must sample exactly
            # what no guidance samples: the companion then runs but is not mixed in.
            return cond
        return cfg_combine(cond, uncond, torch.full((cond.shape[0],), float(scale)))

    def _draft_probs(self, work: _StepWork, v: int, k: int) -> torch.Tensor | None:
        """q [B, K, V] when some draft came from a draft model's distribution, else None (point masses)."""
        rows = work.probs
        if all(q is None for q in rows):
            return None
        q = torch.zeros(len(rows), k, v)
        for row, (drafts, q_row) in enumerate(zip(work.drafts, rows)):
            n = len(drafts)
            if q_row is None:
                q[row, torch.arange(n), torch.tensor(drafts, dtype=torch.long)] = 1.0
            else:
                q[row, :n, : q_row.shape[1]] = q_row
        return q

    def _conditional(self, snaps: list[RequestSnapshot], drafts: list[tuple[TokenId, ...]], v: VerifyInputs,
                     m: MaskInputs, laws: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> Target | None:
        """The law="conditional" requests' target (their unmasked rows' law, reweighted by what earlier
        attempts learned: kernels/walk_book.py), for verify_step; each one's (p, stop ruled) go to `laws`."""
        rows = [row for row, s in enumerate(snaps) if s.trie is not None]
        if not rows:
            return None

        def target(probs: torch.Tensor) -> torch.Tensor:
            allowed = allowed_ids(v, m, torch.tensor(rows), self.tokenizer_vocab, probs.shape[2])   # [L, K+1, V]
            for a, row in zip(allowed, rows):
                n = len(drafts[row]) + 1
                p = probs[row, :n].clone()
                probs[row, :n], stop_ruled = self.walks.target(snaps[row], drafts[row], p, a[:n])
                laws[row] = (p, stop_ruled)
            return probs

        return target

    def _uniforms(self, snaps: list[RequestSnapshot], k: int) -> torch.Tensor:
        """[B, K+1]: each request draws a fixed number of uniforms per step (step_drafts acceptance
        draws + one resample draw), whatever K this batch has: its stream of randoms, and so its
        output, does not depend on the other requests. Greedy requests draw none (zeros)."""
        per = self.buffers.rows_per_slot
        uniforms = torch.zeros(len(snaps), k + 1)
        for row, s in enumerate(snaps):
            gen = self.generators.get(s.request_id)
            if gen is None:
                continue
            draws = torch.rand(per, generator=gen)
            uniforms[row, :k] = draws[:k]
            uniforms[row, k] = draws[per - 1]
        return uniforms


def _padded(packed: torch.Tensor, widths: list[int], width: int) -> torch.Tensor:
    """Packed rows [sum(widths)] (request b's widths[b] after the ones before it) laid out
    [B, width], the padding 0 (verification never reads past a request's own rows)."""
    if all(w == width for w in widths):
        return packed.view(len(widths), width)
    at = torch.tensor([b * width + j for b, w in enumerate(widths) for j in range(w)])
    return packed.new_zeros(len(widths) * width).index_copy_(0, at, packed).view(len(widths), width)
