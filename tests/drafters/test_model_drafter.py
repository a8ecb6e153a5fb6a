"""ModelDrafter bookkeeping: its cache always equals having fed exactly the committed tokens, and
a pruned head gives the full head's logits at the kept ids."""
from __future__ import annotations

import pytest
import torch

from interlock.drafters.model import DraftLM, ModelDrafter


def fresh_logits(lm: DraftLM, tokens: list[int]) -> torch.Tensor:
    """Logits after `tokens`, from a drafter that saw only them (the slow obvious reference)."""
    ref = ModelDrafter(lm, num_blocks=16, block_size=16)
    ref.add("r", tuple(tokens[:-1]))
    return ref.feed([("r", (tokens[-1],))])[0]


@pytest.mark.parametrize("accepted", [0, 1, 2, 3])
def test_commit_keeps_accepted_drafts_and_rewinds_the_rest(tiny, accepted: int) -> None:
    lm = DraftLM(tiny.model, 2)
    drafter = ModelDrafter(lm, num_blocks=16, block_size=16)
    prompt = (5, 9, 200, 31, 7)
    drafter.add("r", prompt)
    first = drafter.feed([("r", ())])                            # the prompt: logits after it
    assert torch.equal(first[0], fresh_logits(lm, list(prompt)))
    drafts = [11, 12, 13]
    drafter.feed([("r", (drafts[0],))])
    drafter.feed([("r", (drafts[1],))])                          # drafts[2] is never fed
    seq = 0
    assert drafter.kv.length(seq) == len(prompt) + 2
    bonus = 99
    new_tokens = tuple(drafts[:accepted]) + (bonus,)
    drafter.commit("r", new_tokens)
    assert drafter.kv.length(seq) == len(prompt) + min(accepted, 2)
    # The next step continues from exactly prompt + new_tokens.
    nxt = drafter.feed([("r", (42,))])
    assert torch.equal(nxt[0], fresh_logits(lm, list(prompt) + list(new_tokens) + [42]))


def test_remove_frees_every_block(tiny) -> None:
    drafter = ModelDrafter(DraftLM(tiny.model, 1), num_blocks=12, block_size=4)
    for i in range(3):
        drafter.add(f"r{i}", tuple(range(1, 10)))
        drafter.feed([(f"r{i}", (3, 4))])
    assert drafter.kv.num_free_blocks == 12 - 3 * 3
    for i in range(3):
        drafter.remove(f"r{i}")
    assert drafter.kv.num_free_blocks == 12 and len(drafter) == 0


def test_pruned_head_is_the_full_head_at_the_kept_ids(tiny) -> None:
    full = DraftLM(tiny.model, 2)
    d2t = torch.tensor([700, 3, 42, 1000, 5])
    pruned = full.pruned(d2t)
    assert pruned.vocab_size == 5
    tokens = [8, 300, 12, 77]
    assert torch.equal(fresh_logits(pruned, tokens), fresh_logits(full, tokens)[d2t])


@pytest.mark.parametrize("d2t", [[], [1, 1], [-1], [10**6]])
def test_bad_d2t_is_refused(tiny, d2t: list[int]) -> None:
    with pytest.raises(ValueError):
        DraftLM(tiny.model, 1).pruned(torch.tensor(d2t, dtype=torch.long))
