"""Speculative verification on CUDA, in Triton: the `backend="cuda"` variants of rejection.py.

Same terms and semantics as kernels/rejection.py (p, d, q, n, u; B, K, V). The arithmetic is the
torch path's, step for step, so the results are equal on the same uniforms:
- acceptance: u_j < p_j(d_j) / q_j(d_j) with an IEEE-rounded fp32 division (`div_rn`), as torch;
- the residual max(0, p - q) (or p with d zeroed for a point mass) and the "no residual mass ->
  p" fallback, tested as "some weight > 0", which no summation order can change;
- the draw: first id whose fp32 cumulative weight exceeds min(u * total, nextafter(total, 0)).
  The cumulative sum is taken block by block here and by a parallel scan in torch, so the two can
  round differently; they pick different ids only when the target lands within that rounding of a
  CDF step (tests/kernels/test_rejection_cuda.py checks that every difference is such a case, and
  that inputs whose partial sums are exact agree everywhere).

Greedy: one program per (row, position) takes the argmax (lowest id on ties, like torch.argmax),
then one program per row counts the leading matches and writes the tokens. Fixed grids: both
are safe to capture in a CUDA graph. Imported only when the CUDA backend is used.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from interlock.kernels.types import RejectionResult

BLOCK_V = 4096


@triton.jit
def _next_below(x):
    """nextafter(x, 0) for x >= 0 (x = 0 stays 0)."""
    return tl.where(x > 0, (x.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), x)


@triton.jit
def _stochastic_kernel(p_ptr, d_ptr, q_ptr, n_ptr, u_ptr, tokens_ptr, n_acc_ptr, V,
                       K: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.load(n_ptr + b).to(tl.int64), K)
    p_row = p_ptr + b * (K + 1) * V
    # --- acceptance: the leading run of accepted drafts ---
    n_acc = tl.zeros((), tl.int64)
    running = n_acc == 0                                # True
    for j in tl.static_range(K):
        d = tl.load(d_ptr + b * K + j).to(tl.int64)
        in_vocab = (d >= 0) & (d < V)
        d_safe = tl.where(in_vocab, d, 0)
        p_d = tl.load(p_row + j * V + d_safe).to(tl.float32) * in_vocab.to(tl.float32)
        q_d = 1.0
        if HAS_Q:
            q_d = tl.load(q_ptr + (b * K + j) * V + d_safe).to(tl.float32)
        u_j = tl.load(u_ptr + b * (K + 1) + j).to(tl.float32)
        ok = (u_j < tl.fdiv(p_d, q_d, ieee_rounding=True)) & (j < n)
        running = running & ok
        n_acc += running.to(tl.int64)
    rejected = n_acc < n
    # --- the law of the new token: p at n_acc, minus the draft's at a rejection (K >= 1) ---
    slot = tl.minimum(n_acc, K - 1)
    p_at = p_row + n_acc * V
    d_at = tl.load(d_ptr + b * K + slot).to(tl.int64)
    drop_d = rejected & (d_at >= 0) & (d_at < V)      # point mass: zero p at the rejected draft
    q_at = q_ptr + (b * K + slot) * V
    cols = tl.arange(0, BLOCK_V)
    use_residual = n_acc >= 0                          # True: a point-mass residual always has mass
    if HAS_Q:
        # pass 1: is there residual mass? (order-free: any positive weight), else p itself
        mass = n_acc < 0                               # False
        for start in range(0, V, BLOCK_V):
            w = _weights(p_at, q_at, start + cols, V, rejected, use_residual, drop_d, d_at, HAS_Q)
            mass = mass | (tl.max(w, 0) > 0)
        use_residual = mass
    # pass 2: the total as the running cumulative sum will see it; pass 3: the draw
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        ids = start + cols
        w = _weights(p_at, q_at, ids, V, rejected, use_residual, drop_d, d_at, HAS_Q)
        total = tl.max(total + tl.cumsum(w, 0), 0)
    u_k = tl.load(u_ptr + b * (K + 1) + K).to(tl.float32)
    target = tl.minimum(u_k * total, _next_below(total))
    base = tl.zeros((), tl.float32)
    first = tl.full((), 2**62, tl.int64)
    for start in range(0, V, BLOCK_V):
        ids = start + cols
        w = _weights(p_at, q_at, ids, V, rejected, use_residual, drop_d, d_at, HAS_Q)
        cdf = base + tl.cumsum(w, 0)
        hit = (cdf > target) & (ids < V)
        first = tl.minimum(first, tl.min(tl.where(hit, ids.to(tl.int64), 2**62), 0))
        base = tl.max(cdf, 0)
    new = tl.minimum(first, V - 1)
    _assemble(d_ptr, tokens_ptr, n_acc_ptr, b, n_acc, new, K)


@triton.jit
def _weights(p_at, q_at, ids, V, rejected, use_residual, drop_d, d_at, HAS_Q: tl.constexpr):
    w = tl.load(p_at + ids, mask=ids < V, other=0.0).to(tl.float32)
    if HAS_Q:
        take_q = (rejected & use_residual).to(tl.float32)   # 1: p - q (rejected); 0: p (bonus draw)
        qv = tl.load(q_at + ids, mask=ids < V, other=0.0).to(tl.float32) * take_q
        w = tl.maximum(w - qv, 0.0)
    else:
        w = tl.where(drop_d & (ids == d_at), 0.0, w)
    return w


@triton.jit
def _assemble(d_ptr, tokens_ptr, n_acc_ptr, b, n_acc, new, K: tl.constexpr):
    for j in tl.static_range(K + 1):
        if j < K:
            d = tl.load(d_ptr + b * K + j).to(tl.int64)
        else:
            d = tl.full((), -1, tl.int64)
        out = tl.where(j < n_acc, d, tl.where(j == n_acc, new, -1))
        tl.store(tokens_ptr + b * (K + 1) + j, out)
    tl.store(n_acc_ptr + b, n_acc)


@triton.jit
def _argmax_kernel(x_ptr, best_ptr, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    best_val = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), 2**62, tl.int64)
    for start in range(0, V, BLOCK_V):
        ids = start + cols
        x = tl.load(x_ptr + row * V + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 0)
        i = tl.min(tl.where((x == m) & (ids < V), ids.to(tl.int64), 2**62), 0)
        better = (m > best_val) | (best_id == 2**62)
        best_id = tl.where(better, i, best_id)
        best_val = tl.where(better, m, best_val)
    tl.store(best_ptr + row, tl.minimum(best_id, V - 1))


@triton.jit
def _greedy_kernel(best_ptr, d_ptr, n_ptr, tokens_ptr, n_acc_ptr, K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.load(n_ptr + b).to(tl.int64), K)
    n_acc = tl.zeros((), tl.int64)
    running = n_acc == 0                                # True
    for j in tl.static_range(K):
        ok = (tl.load(best_ptr + b * (K + 1) + j) == tl.load(d_ptr + b * K + j).to(tl.int64)) & (j < n)
        running = running & ok
        n_acc += running.to(tl.int64)
    new = tl.load(best_ptr + b * (K + 1) + n_acc)
    _assemble(d_ptr, tokens_ptr, n_acc_ptr, b, n_acc, new, K)


def rejection_sample_triton(p: torch.Tensor, d: torch.Tensor, q: torch.Tensor | None, n: torch.Tensor,
                            u: torch.Tensor) -> RejectionResult:
    """Stochastic verification; arguments already checked by the dispatcher."""
    n_rows, k_plus_1, vocab = p.shape
    tokens = torch.empty(n_rows, k_plus_1, dtype=torch.int64, device=p.device)
    n_acc = torch.empty(n_rows, dtype=torch.int64, device=p.device)
    if n_rows:
        p, d, n, u = p.contiguous(), d.contiguous(), n.contiguous(), u.contiguous()
        q_arg = p if q is None else q.contiguous()
        _stochastic_kernel[(n_rows,)](p, d, q_arg, n, u, tokens, n_acc, vocab, K=k_plus_1 - 1,
                                      HAS_Q=q is not None, BLOCK_V=BLOCK_V, num_warps=8)
    return RejectionResult(n_acc, tokens)


def rejection_sample_greedy_triton(logits: torch.Tensor, d: torch.Tensor, n: torch.Tensor) -> RejectionResult:
    """Greedy verification; arguments already checked by the dispatcher."""
    n_rows, k_plus_1, vocab = logits.shape
    tokens = torch.empty(n_rows, k_plus_1, dtype=torch.int64, device=logits.device)
    n_acc = torch.empty(n_rows, dtype=torch.int64, device=logits.device)
    if n_rows:
        best = torch.empty(n_rows, k_plus_1, dtype=torch.int64, device=logits.device)
        _argmax_kernel[(n_rows * k_plus_1,)](logits.contiguous(), best, vocab, BLOCK_V=BLOCK_V, num_warps=8)
        _greedy_kernel[(n_rows,)](best, d.contiguous(), n.contiguous(), tokens, n_acc, K=k_plus_1 - 1)
    return RejectionResult(n_acc, tokens)
