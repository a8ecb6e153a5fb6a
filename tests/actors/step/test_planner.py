"""The planner's pure functions: the row, block and budget facts every sizing reads, what a step
holds (decode rows first, whole prompt chunks within the budget) and what a step reserves."""
from __future__ import annotations

import pytest

from interlock.actors.step.planner import (Request, SchedulerConfig, blocks_for, decode_rows, guided_rows, next_chunk,
                                      plan_step, reservations, sequence_blocks)
from interlock.output.delivery import Output
from interlock.output.stream import OutputStream
from interlock.protocol.messages import GuideChunk, RequestSnapshot, RequestSpec, StepPlan
from interlock.protocol.sampling import SamplingParams
from interlock.testing.tokenizers import byte_tokenizer


def spec(rid: str, prompt_len: int, max_tokens: int = 8, uncond_len: int | None = None) -> RequestSpec:
    uncond = tuple(range(1, uncond_len + 1)) if uncond_len is not None else None
    return RequestSpec(rid, tuple(range(1, prompt_len + 1)), None, SamplingParams(max_tokens=max_tokens), uncond)


def test_row_and_block_counts_by_hand() -> None:
    assert decode_rows(8, 4) == 40 and decode_rows(3, 0) == 3
    assert guided_rows(8, 4) == 80                      # each request's companion rows beside its own
    assert sequence_blocks(16, 0, 16) == 2              # 16 positions and the next step's row: 17
    assert sequence_blocks(15, 0, 16) == 1
    assert sequence_blocks(100, 3, 16) == 7             # ceil(104 / 16)
    assert SchedulerConfig(max_batch_size=2, max_drafts=3, max_position=100).max_blocks == 7


def test_the_step_budget_is_raised_to_one_full_decode_step() -> None:
    assert SchedulerConfig(max_batch_size=8, max_drafts=4, max_step_tokens=16).step_budget == 40
    assert SchedulerConfig(max_batch_size=8, max_drafts=4, max_step_tokens=512).step_budget == 512
    with pytest.raises(ValueError, match="max_step_tokens"):
        SchedulerConfig(max_batch_size=1, max_drafts=0, max_step_tokens=0)


def test_blocks_for_counts_the_companion_and_caps_at_the_context() -> None:
    config = SchedulerConfig(max_batch_size=1, max_drafts=3, max_position=100, block_size=16)
    assert blocks_for(spec("a", 10, max_tokens=20), config) == 3             # ceil((10 + 20 + 4) / 16)
    assert blocks_for(spec("a", 10, max_tokens=10_000), config) == config.max_blocks
    assert blocks_for(spec("a", 10, max_tokens=20, uncond_len=40), config) == 3 + 4   # + ceil(64 / 16)


def test_next_chunk_stops_at_the_chunk_boundary_and_before_the_last_token() -> None:
    config = SchedulerConfig(max_batch_size=1, max_drafts=0, prefill_chunk=4)
    prompt = tuple(range(10))
    assert next_chunk(config, prompt, 0) == (0, 1, 2, 3)
    assert next_chunk(config, prompt, 2) == (2, 3)             # a cached start runs to the next boundary
    assert next_chunk(config, prompt, 8) == (8,)               # the last token is fed by the first decode step
    assert next_chunk(config, prompt, 9) == ()


def test_reservations_add_draft_rows_only_where_a_request_samples() -> None:
    params = SamplingParams()
    decode = RequestSnapshot("a", 0, 10, 5, (7,), True, False, params, GuideChunk(11, 5, (7,)))
    prefill = RequestSnapshot("b", 1, 12, 0, (1, 2, 3), False, False, params, None)
    plan = StepPlan(0, (decode, prefill), max_drafts=4)
    assert reservations(plan) == ((10, 5), (11, 5), (12, 3))


async def test_plan_step_puts_decode_rows_first_and_whole_chunks_within_the_budget() -> None:
    tok = byte_tokenizer()
    config = SchedulerConfig(max_batch_size=3, max_drafts=1, prefill_chunk=8, max_step_tokens=12)

    def request(s: RequestSpec, seq: int, computed: int) -> Request:
        return Request(Output.new(s, OutputStream(4), tok), seq, None, blocks_for(s, config), computed=computed)

    running = {0: request(spec("p1", 20), 0, 0), 1: request(spec("d", 5), 1, 4), 2: request(spec("p2", 20), 2, 0)}
    snaps = plan_step(running, config)
    # the decode row (1 + K = 2 tokens) first; then p1's 8-token chunk fits the 10 left, p2's does not
    assert [(s.request_id, s.sample, s.chunk) for s in snaps] == [("d", True, (5,)), ("p1", False, tuple(range(1, 9)))]

    running[1].out.pending.extend([object(), object()])       # a slow consumer: two deltas unread
    assert [s.request_id for s in plan_step(running, config)] == ["p1"]
