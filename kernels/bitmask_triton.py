"""Grammar bitmask apply on CUDA, in Triton: the `backend="cuda"` variant of bitmask.py.

Same terms and semantics as kernels/bitmask.py. One program per (logits row, block of BLOCK
vocabulary ids): a skipped row returns at once; otherwise each id reads the bit of its target id
(itself, or d2t[id]) from its bitmask row and disallowed ids get -inf. Logits are only written,
never read, so an allowed logit is untouched bit for bit. Fixed grid for fixed shapes: safe to
capture in a CUDA graph. Imported only when the CUDA backend is used.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


# No specialization on the integer arguments: Triton turns an argument equal to 1 into a constant,
# and a [R, 1] logits tensor (vocab 1, row stride 1) left rows unmasked on an H100 (the same kernel
# is right under the interpreter, tests/kernels/test_bitmask_vocab_sizes.py); these ints are cheap.
@triton.jit(do_not_specialize=["logits_stride", "bitmask_stride", "vocab", "limit"])
def _apply_kernel(logits_ptr, logits_stride, bitmask_ptr, bitmask_stride, rows_ptr, skip_ptr, d2t_ptr,
                  vocab, limit, HAS_ROWS: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_D2T: tl.constexpr,
                  BLOCK: tl.constexpr):
    r = tl.program_id(0)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    brow = r.to(tl.int64)
    if HAS_ROWS:
        brow = tl.load(rows_ptr + r).to(tl.int64)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_logits = ids < vocab
    target = ids.to(tl.int64)
    if HAS_D2T:
        target = tl.load(d2t_ptr + ids, mask=in_logits, other=-1).to(tl.int64)
    in_range = (target >= 0) & (target < limit)
    safe = tl.where(in_range, target, 0)
    word = tl.load(bitmask_ptr + brow * bitmask_stride + (safe >> 5), mask=in_logits & in_range, other=0)
    allowed = in_range & (((word >> (safe & 31).to(tl.int32)) & 1) == 1)
    neg_inf = tl.full((BLOCK,), float("-inf"), tl.float32)
    tl.store(logits_ptr + r.to(tl.int64) * logits_stride + ids, neg_inf.to(logits_ptr.dtype.element_ty),
             mask=in_logits & ~allowed)


def apply_token_bitmask_triton_(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None,
                                skip: torch.Tensor | None, d2t: torch.Tensor | None, limit: int) -> None:
    """In place on logits [R, V]; arguments already checked by the dispatcher."""
    n_rows, vocab = logits.shape
    if n_rows == 0 or vocab == 0:
        return
    if logits.stride(1) != 1:
        raise ValueError("the cuda backend needs logits rows with unit stride")
    bitmask = bitmask if bitmask.stride(1) == 1 else bitmask.contiguous()
    dummy = bitmask  # any pointer for absent optional tensors (the constexpr flags skip them)
    grid = (n_rows, triton.cdiv(vocab, BLOCK))
    _apply_kernel[grid](
        logits, logits.stride(0), bitmask, bitmask.stride(0),
        dummy if rows is None else rows.contiguous(),
        dummy if skip is None else skip.contiguous().view(torch.uint8),
        dummy if d2t is None else d2t.contiguous(),
        vocab, limit,
        HAS_ROWS=rows is not None, HAS_SKIP=skip is not None, HAS_D2T=d2t is not None, BLOCK=BLOCK,
    )
