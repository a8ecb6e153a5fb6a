"""Log-probabilities of emitted tokens under the distribution they were verified against.

Terms (as in sampling.py):
  R   rows (one per emitted token); V vocabulary size; N alternatives per row (0..20)
  x   the row's logits after penalties, guidance and the grammar mask (-inf: not allowed)
  T   temperature [R]; a greedy row (T == 0) is reported at T = 1: its law is one-hot, whose
      log-probabilities (0 and -inf) say nothing, so we report the softmax of the same masked
      logits at T = 1 (what OpenAI and vLLM report for greedy requests); top-k / top-p apply as usual
  k, P  top-k [R] and top-p [R] as in sampling.py (None: off for every row)

logp = log_softmax(filter_{k,P}(x / T)): exactly log(probs_from_logits(x, T, k, P)) up to rounding,
the p that rejection sampling accepts and resamples with, so a token gets the same numbers with or
without speculation. Alternatives are the N most likely ids of the row, most likely first (ties:
lower id first); ids with logp = -inf are never listed (the caller drops -inf entries, which only
appear when the row allows fewer than N ids).
"""
from __future__ import annotations

import torch

from interlock.kernels._checks import FLOAT_DTYPES, INDEX_DTYPES, Backend, check_device, check_dtype, check_shape, \
    resolve_backend
from interlock.kernels.logprobs_reference import token_logprobs_reference
from interlock.kernels.sampling import _keep_top_k_top_p
from interlock.kernels.types import Logprobs


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor,
                   top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None, *, n: int = 0,
                   backend: Backend = "auto") -> Logprobs:
    """Log-probabilities of tokens [R] under masked logits [R, V], and each row's n best ids.

    temperature, top_p: float [R]; top_k: int [R]; see the module docstring for greedy rows.

    Raises:
        ValueError: unknown backend, wrong dtype or shape, n outside [0, V], mixed devices.
    """
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_shape("logits", logits, (None, None))
    rows, vocab = logits.shape
    check_dtype("tokens", tokens, INDEX_DTYPES)
    check_shape("tokens", tokens, (rows,))
    for name, t, dtypes in (("temperature", temperature, FLOAT_DTYPES), ("top_k", top_k, INDEX_DTYPES),
                            ("top_p", top_p, FLOAT_DTYPES)):
        if t is not None:
            check_dtype(name, t, dtypes)
            check_shape(name, t, (rows,))
    check_device(logits.device, tokens=tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    if not 0 <= n <= vocab:
        raise ValueError(f"n must be in [0, {vocab}], got {n}")
    if resolve_backend(backend, logits.device) == "reference":
        return token_logprobs_reference(logits, tokens, temperature, top_k, top_p, n)
    return _logprobs_torch(logits, tokens, temperature, top_k, top_p, n)


def _logprobs_torch(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor,
                    top_k: torch.Tensor | None, top_p: torch.Tensor | None, n: int) -> Logprobs:
    t = torch.where(temperature > 0, temperature.float(), 1.0)        # [R]; greedy rows at T = 1
    x = logits.float() / t.unsqueeze(1)                                # [R, V]
    if top_k is not None or top_p is not None:
        k = top_k if top_k is not None else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        p = top_p.float() if top_p is not None else torch.ones(x.shape[0], device=x.device)
        x = x.masked_fill(~_keep_top_k_top_p(x, k, p), float("-inf"))
    logp = torch.log_softmax(x, dim=-1)                                # [R, V]
    token = logp.gather(1, tokens.long().unsqueeze(1)).squeeze(1)     # [R]
    if n == 0:
        empty = torch.empty(x.shape[0], 0, device=x.device)
        return Logprobs(token, empty.long(), empty)
    top, ids = logp.sort(dim=-1, descending=True, stable=True)        # stable: ties keep lower ids first
    return Logprobs(token, ids[:, :n], top[:, :n])
