"""Grammar bitmask apply: every disallowed logit becomes -inf, in place.

Terms (used in the shape comments below):
  R      logits rows (one per sampled position)
  V      logits vocabulary (the target model's, or the draft model's when d2t is given)
  R'     bitmask rows;  W = int32 words per bitmask row;  the mask covers ids 0 .. 32*W-1
  L      mask vocabulary: ids >= L are disallowed (L = min(mask_vocab_size, 32*W))
Bit j of word i set  <=>  token 32*i + j allowed (the xgrammar/llguidance convention).
Words are int32, so bit 31 is the sign bit; an arithmetic shift keeps it readable.
"""
from __future__ import annotations

import torch

from interlock.kernels._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    Backend,
    check_device,
    check_dtype,
    check_shape,
    resolve_backend,
)


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    skip: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    mask_vocab_size: int | None = None,
    backend: Backend = "auto",
) -> None:
    """Set the logits of tokens the grammar disallows to -inf, in place.

    Args:
        logits: [R, V] float32/bfloat16/float16, modified in place.
        bitmask: [R', W] int32; bit j of word i set means token 32*i + j is allowed.
        rows: [R] int32/int64 or None: logits row r reads bitmask row rows[r]. None means
            row r reads bitmask row r (then R' >= R).
        skip: [R] bool or None: rows where skip is True have no grammar and are untouched.
        d2t: [V] int64 or None: the logits are over a draft vocabulary and draft id t reads
            the bit of target id d2t[t]; a negative d2t[t] (no target counterpart) is
            disallowed.
        mask_vocab_size: ids >= this are disallowed even if their bit is set (the padded
            ids of a model whose vocabulary is larger than the tokenizer's). Default 32*W.
        backend: "auto" (the Triton kernel for CUDA tensors, else "torch") | "torch" (on
            the host: xgrammar's C++ kernel for contiguous fp32 CPU logits without d2t, torch
            ops otherwise) | "reference" | "cuda" (kernels/bitmask_triton.py; CUDA tensors only)
            | "capturable" (no host read: the Triton kernel on CUDA, tensor ops elsewhere; what
            a captured step runs).

    Token ids outside [0, min(mask_vocab_size, 32*W)) are always disallowed. A row whose
    every token is disallowed becomes all -inf; callers must not sample it. Index values
    are not range-checked on the fast path (that would need a host sync).

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    _check(logits, bitmask, rows, skip, d2t)
    limit = 32 * bitmask.shape[1]
    if mask_vocab_size is not None:
        limit = min(limit, mask_vocab_size)
    resolved = resolve_backend(backend, logits.device, has_cuda=True)
    if resolved == "cuda":
        from interlock.kernels.bitmask_triton import apply_token_bitmask_triton_  # needs triton + CUDA

        apply_token_bitmask_triton_(logits, bitmask, rows, skip, d2t, limit)
    elif resolved == "torch":
        _apply_torch_(logits, bitmask, rows, skip, d2t, limit)
    elif resolved == "tensor":
        _apply_tensor_ops_(logits, bitmask, rows, skip, d2t, limit)
    else:
        apply_token_bitmask_reference_(logits, bitmask, rows, skip, d2t, limit)


def _check(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None,
    skip: torch.Tensor | None,
    d2t: torch.Tensor | None,
) -> None:
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_dtype("bitmask", bitmask, (torch.int32,))
    check_shape("logits", logits, (None, None))
    check_shape("bitmask", bitmask, (None, None))
    check_device(logits.device, bitmask=bitmask, rows=rows, skip=skip, d2t=d2t)
    n_rows, vocab = logits.shape
    if rows is not None:
        check_dtype("rows", rows, INDEX_DTYPES)
        check_shape("rows", rows, (n_rows,))
    elif bitmask.shape[0] < n_rows:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {n_rows} logits rows and no rows map")
    if skip is not None:
        check_dtype("skip", skip, (torch.bool,))
        check_shape("skip", skip, (n_rows,))
    if d2t is not None:
        check_dtype("d2t", d2t, (torch.int64,))
        check_shape("d2t", d2t, (vocab,))


def allowed_tokens(
    bitmask: torch.Tensor, rows: torch.Tensor | None, d2t: torch.Tensor | None, vocab: int, limit: int
) -> torch.Tensor:
    """Boolean [R, V] of allowed tokens; R = len(rows) or the bitmask's row count."""
    device = bitmask.device
    words = bitmask if rows is None else bitmask.index_select(0, rows.long())  # [R, W]
    ids = torch.arange(vocab, device=device) if d2t is None else d2t  # [V] target ids
    in_range = (ids >= 0) & (ids < limit)  # [V]
    safe = ids.clamp(0, 32 * bitmask.shape[1] - 1)  # [V], gatherable everywhere
    word = words.index_select(1, safe >> 5)  # [R, V] the word holding each id's bit
    bit = (word >> (safe & 31).to(torch.int32)) & 1  # [R, V] arithmetic shift keeps bit 31
    return (bit == 1) & in_range


def _apply_torch_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None,
    skip: torch.Tensor | None,
    d2t: torch.Tensor | None,
    limit: int,
) -> None:
    n_rows, vocab = logits.shape
    if rows is None:
        bitmask = bitmask[:n_rows]
    # xgrammar's kernel writes past the end of the logits for some vocabularies that are not a
    # multiple of 32 (V = 1, 2, 3, 5 seen; tests/kernels/test_bitmask_vocab_sizes.py): it gets
    # only the whole-word vocabularies every real checkpoint pads to.
    if d2t is None and logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous() \
            and vocab % 32 == 0:
        _apply_xgrammar_cpu_(logits, bitmask, rows, skip, limit)
        return
    _apply_tensor_ops_(logits, bitmask, rows, skip, d2t, limit)


def _apply_tensor_ops_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None,
    skip: torch.Tensor | None,
    d2t: torch.Tensor | None,
    limit: int,
) -> None:
    """Fixed-shape tensor ops, no host read: capturable on any device."""
    n_rows, vocab = logits.shape
    if rows is None:
        bitmask = bitmask[:n_rows]
    banned = ~allowed_tokens(bitmask, rows, d2t, vocab, limit)  # [R, V]
    if skip is not None:
        banned &= ~skip.unsqueeze(1)
    logits.masked_fill_(banned, float("-inf"))


def _apply_xgrammar_cpu_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None, skip: torch.Tensor | None, limit: int
) -> None:
    """xgrammar's C++ kernel: one pass over each masked row. The torch version above builds ~8
    [R, V] temporaries (1.1 ms of a ~8 ms verify step at R = 4, V = 49,152, measured with py-spy
    on `interlock bench`); this one costs tens of microseconds."""
    import xgrammar

    words = bitmask if rows is None else bitmask.index_select(0, rows.long())   # [R, W]
    masked = list(range(logits.shape[0])) if skip is None else (~skip).nonzero().flatten().tolist()
    if not masked:
        return
    # xgrammar masks ids < vocab_size and leaves the rest alone; ours disallows ids >= limit.
    xgrammar.apply_token_bitmask_inplace(logits, words, vocab_size=min(limit, logits.shape[1]),
                                         indices=masked, backend="cpu")
    if limit < logits.shape[1]:
        logits[masked, limit:] = float("-inf")


def apply_token_bitmask_reference_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None,
    skip: torch.Tensor | None,
    d2t: torch.Tensor | None,
    limit: int,
) -> None:
    """Slow obvious version: one Python test per (row, token)."""
    n_rows, vocab = logits.shape
    words = bitmask.tolist()
    row_of = rows.tolist() if rows is not None else list(range(n_rows))
    skipped = skip.tolist() if skip is not None else [False] * n_rows
    target = d2t.tolist() if d2t is not None else list(range(vocab))
    for r in range(n_rows):
        if skipped[r]:
            continue
        row = words[row_of[r]]
        banned = [t for t in range(vocab) if not _bit_allowed(row, target[t], limit)]
        logits[r, banned] = float("-inf")


def _bit_allowed(row: list[int], token: int, limit: int) -> bool:
    # Python's >> on a negative int is arithmetic too, so bit 31 reads as 1.
    return 0 <= token < limit and (row[token // 32] >> (token % 32)) & 1 == 1
