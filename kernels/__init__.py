"""Synchronous tensor functions: bitmask apply, sampling, rejection sampling, CFG combine, penalties.

Each public function is a dispatcher with an explicit `backend=` ("auto", "torch",
"reference", and "cuda" for the Triton kernels of bitmask apply and rejection sampling, which
"auto" picks for CUDA tensors) that raises ValueError on an unknown backend, a wrong dtype or
shape, tensors on mixed devices, or "cuda" for tensors elsewhere or a kernel without one.
The "torch" fast paths keep fixed shapes and make no host sync, so they can sit in a
captured CUDA graph; the "reference" versions loop in Python and are the obvious spec.

- bitmask.py     apply_token_bitmask_: grammar bitmask -> -inf logits, in place
                 (row map, skip rows, draft->target vocabulary map, mask vocabulary limit)
- sampling.py    probs_from_logits (temperature / top-k / top-p / greedy),
                 sample_from_probs and sample (inverse CDF on caller-drawn uniforms),
                 draw_uniforms (per-request seeded generators)
- rejection.py   rejection_sample (stochastic, point-mass or probabilistic drafts) and
                 rejection_sample_greedy: speculative verification over [B, K] drafts
- logprobs.py    token_logprobs: an emitted token's log-probability and its row's top-N, under
                 the masked law it was verified against (greedy rows at temperature 1)
- cfg.py         cfg_combine: classifier-free guidance per-row scale
- penalties.py   apply_penalties (repetition / frequency / presence) and draft_counts (each verify
                 position's counts: output + the drafts before it, so penalties stay exact)
- penalty_book.py PenaltyBook: the per-request prompt and output counts penalties.py reads (both
                 runners' VerifierActor holds one, on the logits' device)
- verify.py      verify_step: a step's whole verification (masks, moot drafts, greedy / rejection
                 sampling), the acceptance law both runners call; verify_features.py the CFG,
                 penalty and logprob work around it
- conditional.py the law="conditional" target at a verify row: the model's unmasked law reweighted by
                 what earlier attempts proved dead (live_weights, conditional_target)
- walk_book.py   WalkBook: the VerifierActor's per-request walk of a conditional attempt through its
                 trie snapshot (the target rows, the Visits, the refusal that ends the attempt)
- types.py       RejectionResult
- native.py      our CPU kernels (csrc/, built on first use with the machine's compiler):
                 int8_linear (decode / verify projections, and prompt chunks on AMX tiles),
                 int4_linear (4-bit weights: the same, every row count),
                 row_attention and rms_norm, and rows_forward, every layer of a decode / verify
                 step (or a prompt chunk, Transformer.rows_prefill) in one call; each computes
                 a row from that row alone, in a fixed order (batch invariant). models/ uses
                 them when they build and falls back to torch ops when they do not; and
                 masked_argmax, greedy verification's one pass over a row (the largest logit its
                 grammar row allows), which the VerifierActor's lean path calls, and head_argmax,
                 the same from the hidden rows, computing only the allowed logits of narrow masks
- int4_pack.py   the int4 weight format int4_linear reads (csrc/int4_linear.h): packing from floats
                 and from a GGUF's Q4_0 / Q4_1 / Q4_K blocks, and reading it back
- *_reference.py the slow obvious versions; _checks.py the shared argument checks
- *_triton.py    the CUDA variants (bitmask_triton.py, rejection_triton.py), imported only
                 when backend "cuda" runs
"""
from __future__ import annotations

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.cfg import cfg_combine
from interlock.kernels.logprobs import token_logprobs
from interlock.kernels.penalties import apply_penalties, draft_counts
from interlock.kernels.rejection import rejection_sample, rejection_sample_greedy
from interlock.kernels.sampling import draw_uniforms, probs_from_logits, sample, sample_from_probs
from interlock.kernels.types import Logprobs, RejectionResult

__all__ = [
    "Logprobs",
    "RejectionResult",
    "apply_penalties",
    "apply_token_bitmask_",
    "cfg_combine",
    "draft_counts",
    "draw_uniforms",
    "probs_from_logits",
    "rejection_sample",
    "rejection_sample_greedy",
    "sample",
    "sample_from_probs",
    "token_logprobs",
]
