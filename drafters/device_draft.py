"""The draft model on the device runner: K draft rounds inside the captured step, masks included.

Terms: B lanes (the step's sampling requests; lane b's target rows are b*(D+1)+j), D draft rows per
lane (SpeculativeConfig.step_drafts), K draft rounds (max_draft_len), Vd the draft vocabulary,
V the target's, S slots, W bitmask words.

A lane's row of `tokens` [B, D+1] is [t, d1, ..., dD]: its last committed token and its drafts, as
the target's forward reads them. The prologue writes it (a lookup lane's drafts; a model lane's
forced head), and each round j = 1..K, as fixed-shape device work:
- `forward(j)`: the draft model over one row per lane, `tokens[:, j-1]` at position n+j-1 (its
  own paged KV cache, one block table per slot on the device), logits [B, Vd];
- `sample(j)`, after the grammar's draft-side row for that position went up: a model lane that is
  still drafting (j <= its budget k, no end-of-sequence token or empty row yet) takes its forced
  head token or draws under the row (kernels/draft_sample.py); `tokens[:, j]`, the drafts count
  and q (the law each draft was drawn from, for verification) are updated on the device, and
  copied to pinned memory for the next round's host function.
Round K+1 only feeds `tokens[:, K]`, so that the draft cache holds t, d1..dK: after verification it
keeps t and the accepted drafts, exactly the committed tokens, and the next step starts in sync.
When it falls behind (a new prompt, a prefix-cache hit, more than K accepted lookup drafts), the
prologue feeds the missing committed tokens eagerly (`catch_up`) before the step's program.

Block-table updates, as the target's (actors/device/verifier.py): the captured `start` applies a
fixed room of `room` entries whatever the step writes (a replay replays the count it was captured
with), the unused ones aimed at a scratch row; a step that writes more (a catch-up, a new table)
applies all of its updates eagerly in `catch_up`, from a second region of the buffer, and leaves
the room to scratch.

Greedy lanes take the masked argmax; sampled ones draw with K uniforms per step from their own
generator (seed salted as the host runner's draft generator), whatever the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from interlock.kernels.draft_sample import sample_drafts
from interlock.kernels.sampling import request_generator
from interlock.models.device_llama import DeviceLlama, StepInputs
from interlock.models.kv_cache import PagedKVCache, slots_of
from interlock.models.table_mirror import TableMirror, numpy_views
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.types import RequestId, TokenId

DRAFT_SALT = 0x5EED        # the host runner's draft generators use the same salt (drafters/model.py)


def updates_per_lane(rounds: int, block_size: int) -> int:
    """Block-table entries a lane's K+1 fed positions may add in one step (the blocks they span)."""
    return -(-(rounds + 1) // block_size) + 1


@dataclass(frozen=True)
class DeviceDraftLM:
    """A draft model on the device: the first `n_layers` of `model` (a self-draft shares the target's
    weights), with an optional pruned head [Vd, E] and its d2t map [Vd] (target ids)."""

    model: DeviceLlama
    n_layers: int
    head: torch.Tensor | None = None
    d2t: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size if self.d2t is None else len(self.d2t)

    def cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        config = self.model.config.first_layers(self.n_layers)
        return PagedKVCache(config, num_blocks=num_blocks, block_size=block_size, device=self.model.device,
                            prefix_caching=False, spare_blocks=1)


@dataclass(frozen=True)
class RoundInputs:
    """What the prologue stages for the rounds (one side's copy: pinned host or device)."""

    tokens: torch.Tensor        # [B, D+1] int64
    num: torch.Tensor           # [B] int64: drafts so far
    forced: torch.Tensor        # [B, K] int64: the forced head token of each round, -1 none
    budget: torch.Tensor        # [B] int64: a model lane's k (head included); 0: no model drafts
    masked: torch.Tensor        # [B] bool: draws under the grammar's rows
    temperature: torch.Tensor   # [B] float32
    top_k: torch.Tensor         # [B] int64
    top_p: torch.Tensor         # [B] float32
    uniforms: torch.Tensor      # [B, K] float32
    positions: torch.Tensor     # [B, K+1] int64
    write_slots: torch.Tensor   # [B, K+1] int64
    row_table: torch.Tensor     # [B] int64
    update_index: torch.Tensor  # [U] int64
    update_block: torch.Tensor  # [U] int32

    @classmethod
    def allocate(cls, b: int, d: int, k: int, u: int, device: torch.device, pin: bool) -> RoundInputs:
        def z(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        f32 = torch.float32
        return cls(z(b, d + 1), z(b), z(b, k), z(b), z(b, dtype=torch.bool), z(b, dtype=f32), z(b),
                   z(b, dtype=f32), z(b, k, dtype=f32), z(b, k + 1), z(b, k + 1), z(b), z(u),
                   z(u, dtype=torch.int32))


@dataclass
class _Request:
    seq: int
    tokens: list[TokenId]       # prompt + committed
    length: int = 0             # positions the draft cache holds
    generator: torch.Generator | None = None


@dataclass(frozen=True)
class LaneAsk:
    """One lane of a step as the draft model sees it."""

    lane: int
    request_id: RequestId
    slot: int
    start: int                          # n: the position of t, the lane's committed length
    drafts: tuple[TokenId, ...]         # a lookup lane's drafts, or a model lane's forced head
    budget: int                         # k for a model lane (head included), 0 for a lookup lane
    sampling: SamplingParams
    masked: bool


class DeviceDrafter:
    """Per-request bookkeeping, the draft cache and the round buffers (module docstring)."""

    def __init__(self, lm: DeviceDraftLM, *, slots: int, lanes: int, draft_rows: int, rounds: int,
                 num_blocks: int, block_size: int, max_blocks: int, vocab: int, mask_words: int,
                 eos: tuple[int, ...], prefill_chunk: int) -> None:
        self.lm, self.k, self.d, self.vocab = lm, rounds, draft_rows, vocab
        self.prefill_chunk = prefill_chunk
        device = lm.model.device
        pin = device.type == "cuda"
        self.kv = lm.cache(num_blocks, block_size)
        self.pad_slot = num_blocks * block_size
        self.room = lanes * updates_per_lane(rounds, block_size)    # the captured start's fixed count
        updates = self.room + max(slots * max_blocks, lanes * 2 * (rounds + 1))
        self.host = RoundInputs.allocate(lanes, draft_rows, rounds, updates, torch.device("cpu"), pin)
        self.dev = RoundInputs.allocate(lanes, draft_rows, rounds, updates, device, False)
        self.np = numpy_views(self.host)
        self.mirror = TableMirror(slots, max_blocks)
        tables = torch.zeros(slots + 2, max_blocks, dtype=torch.int32)
        tables[slots, 0] = num_blocks
        self.tables = tables.to(device)
        self.pad_table, self.scratch = slots, (slots + 1) * max_blocks
        self.eos = torch.tensor(sorted(eos) or [-1], dtype=torch.int64, device=device)
        self.d2t = None if lm.d2t is None else lm.d2t.to(device)
        self.head = lm.head
        self.stopped = torch.zeros(lanes, dtype=torch.bool, device=device)
        self.q = torch.zeros(lanes, draft_rows, vocab, dtype=torch.float32, device=device)
        self.lanes_index = torch.arange(lanes, device=device)
        self.out = tuple(torch.zeros(shape, dtype=dtype, pin_memory=pin) for shape, dtype in (
            ((lanes, draft_rows + 1), torch.int64), ((lanes,), torch.int64), ((lanes,), torch.bool)))
        self.np_out = tuple(t.numpy() for t in self.out)
        # a round's grammar rows, one per lane, contiguous (a strided H2D copy would stage on the host)
        self.host_rows = torch.zeros(lanes, mask_words, dtype=torch.int32, pin_memory=pin)
        self.host_free = torch.zeros(lanes, dtype=torch.bool, pin_memory=pin)
        self.dev_rows = torch.zeros(lanes, mask_words, dtype=torch.int32, device=device)
        self.dev_free = torch.zeros(lanes, dtype=torch.bool, device=device)
        self._requests: dict[RequestId, _Request] = {}
        self._next_seq = 0
        self._logits: torch.Tensor | None = None
        self._eager_updates = 0     # this step's updates applied by catch_up (at [room, room + n))

    # --- requests (between steps) ----------------------------------------------------------------

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        self._requests[request_id] = _Request(self._next_seq, list(prompt))
        self.kv.add_sequence(self._next_seq)
        self._next_seq += 1

    def remove(self, request_id: RequestId) -> None:
        r = self._requests.pop(request_id, None)
        if r is not None:
            self.kv.free(r.seq)

    def counts(self) -> dict[str, int]:
        return {"draft_requests": len(self._requests),
                "draft_generators": sum(r.generator is not None for r in self._requests.values()),
                "draft_kv_free_blocks": self.kv.num_free_blocks, "draft_kv_total_blocks": self.kv.num_blocks}

    # --- the prologue (event loop) ----------------------------------------------------------------

    def stage(self, asks: list[LaneAsk], batch: int) -> list[StepInputs]:
        """Write the rounds' inputs for `batch` lanes (asks and padding); return the catch-up feeds
        (eager device work the caller launches before the step's program)."""
        h, k = self.np, self.k
        catch_up: list[StepInputs] = []
        updates: list[tuple[int, int]] = []
        for name in ("num", "budget", "masked", "temperature", "top_k", "uniforms"):
            h[name][:batch] = 0
        h["top_p"][:batch] = 1.0
        h["forced"][:batch] = -1
        h["tokens"][:batch] = 0
        h["positions"][:batch] = 0
        h["write_slots"][:batch] = self.pad_slot
        h["row_table"][:batch] = self.pad_table
        for a in asks:
            r = self._requests[a.request_id]
            if r.length < a.start:
                catch_up.append(self._feed(r, a.slot, r.tokens[r.length: a.start], updates))
            first = self.kv.reserve(r.seq, k + 1)
            table = self.kv.block_table(r.seq)
            self.mirror.updates(a.slot, r.seq, table, updates)
            b = a.lane
            h["tokens"][b, 0] = r.tokens[a.start]
            h["tokens"][b, 1: 1 + len(a.drafts)] = a.drafts
            h["positions"][b] = np.arange(first, first + k + 1)
            h["write_slots"][b] = slots_of(table, self.kv.block_size, first, k + 1)
            h["row_table"][b] = a.slot
            if not a.budget or len(a.drafts) >= k:   # no round left for the model: its head is its drafts
                h["num"][b] = len(a.drafts)
                continue
            h["forced"][b, : len(a.drafts)] = a.drafts
            h["budget"][b], h["masked"][b] = a.budget, a.masked
            s = a.sampling
            h["temperature"][b] = 0.0 if s.greedy else s.temperature
            h["top_k"][b], h["top_p"][b] = s.top_k or 0, s.top_p or 1.0
            if not s.greedy:
                if r.generator is None:
                    r.generator = request_generator(s.seed, salt=DRAFT_SALT)
                torch.rand(k, generator=r.generator, out=self.host.uniforms[b])
        self._stage_updates(updates, eager=bool(catch_up))
        return catch_up

    def _stage_updates(self, updates: list[tuple[int, int]], eager: bool) -> None:
        """The program's room: this step's updates padded with scratch writes, or all scratch when the
        step applies them eagerly (a catch-up, or more than the room holds)."""
        h, n, room = self.np, len(updates), self.room
        capacity = h["update_index"].shape[0] - room
        if n > capacity:
            raise RuntimeError(f"{n} draft block-table updates in one step, room for {capacity}")
        eager = eager or n > room
        at = room if eager else 0
        if n:
            h["update_index"][at: at + n], h["update_block"][at: at + n] = zip(*updates)
        if eager:
            h["update_index"][:room], h["update_block"][:room] = self.scratch, 0
        else:
            h["update_index"][n: room], h["update_block"][n: room] = self.scratch, 0
        self._eager_updates = n if eager else 0

    def _feed(self, r: _Request, slot: int, tokens: list[TokenId], updates: list[tuple[int, int]]) -> StepInputs:
        """A catch-up feed: committed tokens the draft cache lacks, with no logits (eager work)."""
        first = self.kv.reserve(r.seq, len(tokens))
        table = self.kv.block_table(r.seq)
        self.mirror.updates(slot, r.seq, table, updates)
        r.length = first + len(tokens)
        device = self.lm.model.device
        ids = torch.tensor(tokens, dtype=torch.int64)
        positions = torch.arange(first, first + len(tokens))
        slots = torch.tensor(slots_of(table, self.kv.block_size, first, len(tokens)))
        return StepInputs(ids.to(device), positions.to(device), slots.to(device),
                          torch.full((len(tokens),), slot, dtype=torch.int64).to(device), self.tables,
                          torch.zeros(0, dtype=torch.int64, device=device))

    # --- device work --------------------------------------------------------------------------------

    @property
    def eager_updates(self) -> int:
        """Block-table entries this step applies in `catch_up`, before its program (0: in `start`)."""
        return self._eager_updates

    @torch.inference_mode()
    def catch_up(self, feeds: list[StepInputs]) -> None:
        """Eager device work before the step: the table updates, then what the cache lacks."""
        part = slice(self.room, self.room + self._eager_updates)
        for name in ("update_index", "update_block"):
            getattr(self.dev, name)[part].copy_(getattr(self.host, name)[part], non_blocking=True)
        self._apply_updates(part)
        for inputs in feeds:
            for start in range(0, inputs.rows, self.prefill_chunk):
                part = slice(start, start + self.prefill_chunk)
                chunk = StepInputs(inputs.input_ids[part], inputs.positions[part], inputs.write_slots[part],
                                   inputs.row_table[part], self.tables, inputs.logit_rows)
                self.lm.model(chunk, self.kv, n_layers=self.lm.n_layers, head=self.head)

    @torch.inference_mode()
    def start(self, batch: int, with_q: bool) -> None:
        """Device work, the step's first: upload the rounds' inputs and the room of table updates
        (the same count every step: a replay applies whatever this step staged there)."""
        for f in fields(RoundInputs):
            n = self.room if f.name.startswith("update") else batch
            getattr(self.dev, f.name)[:n].copy_(getattr(self.host, f.name)[:n], non_blocking=True)
        self._apply_updates(slice(0, self.room))
        self.stopped[:batch] = self.dev.budget[:batch] == 0       # lookup lanes never draft with the model
        if with_q:                                               # lookup drafts and heads are point masses
            q = self.q[:batch]
            q.zero_()
            q.scatter_(2, self.dev.tokens[:batch, 1:].clamp(max=self.vocab - 1).unsqueeze(2), 1.0)

    def _apply_updates(self, part: slice) -> None:
        if part.stop > part.start:
            self.tables.view(-1).index_copy_(0, self.dev.update_index[part], self.dev.update_block[part])

    @torch.inference_mode()
    def forward(self, j: int, batch: int) -> None:
        """Device work, round j (1..K+1): the draft forward over tokens[:, j-1] (K+1: feed only)."""
        dv = self.dev
        rows = self.lanes_index[:batch] if j <= self.k else self.lanes_index[:0]
        # a column of [B, K+1] is a strided view: the attention kernel reads `positions` by raw
        # offset (models/kernel_rules.py), so it gets a contiguous copy (one small device copy)
        inputs = StepInputs(dv.tokens[:batch, j - 1], dv.positions[:batch, j - 1].contiguous(),
                            dv.write_slots[:batch, j - 1], dv.row_table[:batch], self.tables, rows)
        self._logits = self.lm.model(inputs, self.kv, n_layers=self.lm.n_layers, head=self.head)

    @torch.inference_mode()
    def sample(self, j: int, batch: int, greedy: bool) -> None:
        """Device work, round j (1..K), after the host function filled its grammar rows (`host_rows`)."""
        dv, b = self.dev, batch
        assert self._logits is not None
        rows, free = self.dev_rows[:b], self.dev_free[:b]
        rows.copy_(self.host_rows[:b], non_blocking=True)
        free.copy_(self.host_free[:b], non_blocking=True)
        active = ~self.stopped[:b] & (j <= dv.budget[:b])
        draw = sample_drafts(self._logits, rows, dv.masked[:b] & ~free, torch.where(active, dv.forced[:b, j - 1], -1),
                             dv.temperature[:b], dv.top_k[:b], dv.top_p[:b], dv.uniforms[:b, j - 1], self.vocab,
                             self.d2t, greedy=greedy)
        took = active & draw.drawn
        dv.tokens[:b, j] = torch.where(took, draw.tokens, dv.tokens[:b, j])
        dv.num[:b] = torch.where(took, j, dv.num[:b])
        ended = ~draw.drawn | (draw.tokens.unsqueeze(1) == self.eos).any(-1)
        self.stopped[:b] |= active & ended
        if draw.q is not None:
            self.q[:b, j - 1] = torch.where(took.unsqueeze(1), draw.q, self.q[:b, j - 1])
        for out, value in zip(self.out, (dv.tokens, dv.num, self.stopped)):
            out[:b].copy_(value[:b], non_blocking=True)

    # --- the step's tail ---------------------------------------------------------------------------

    def drafts(self, lane: int) -> tuple[TokenId, ...]:
        """Host, after the rounds' last copy: the lane's drafts."""
        tokens, num, _ = self.np_out
        return tuple(int(t) for t in tokens[lane, 1: 1 + int(num[lane])])

    def prefix(self, lane: int, j: int) -> tuple[TokenId, ...] | None:
        """Host, before round j: the lane's drafts so far, or None once it stopped drafting. Round 1
        reads nothing: the copies are round j-1's (before round 1, the last step's)."""
        if j == 1:
            return ()
        tokens, num, stopped = self.np_out
        if stopped[lane] or int(num[lane]) < j - 1:
            return None
        return tuple(int(t) for t in tokens[lane, 1:j])

    def commit_step(self, request_id: RequestId, start: int, new_tokens: tuple[TokenId, ...], accepted: int) -> None:
        """The cache fed t, d1..dK at n..n+K: it keeps t and the accepted ones among them."""
        r = self._requests.get(request_id)
        if r is None:
            return
        fed = self.k + 1
        keep = 1 + min(accepted, self.k)
        self.kv.rewind(r.seq, fed - keep)
        r.length = start + keep
        r.tokens.extend(new_tokens)

    def extend(self, request_id: RequestId, new_tokens: tuple[TokenId, ...]) -> None:
        """Tokens committed in a step without rounds: the cache feeds them when it next drafts."""
        r = self._requests.get(request_id)
        if r is not None:
            r.tokens.extend(new_tokens)


def device_draft_lm(model: DeviceLlama, n_layers: int | None = None, head: torch.Tensor | None = None,
                    d2t: torch.Tensor | None = None) -> DeviceDraftLM:
    """A DeviceDraftLM over `model`: its first n_layers (all: None), an optional pruned head."""
    lm = DeviceDraftLM(model, n_layers or model.config.n_layers, head, d2t)
    if head is not None:
        lm = replace(lm, head=head.to(model.device, model.embed.dtype).contiguous())
    return lm
