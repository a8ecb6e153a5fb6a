"""Logits -> probabilities (temperature, top-k, top-p, greedy) and inverse-CDF sampling.

Terms:
  R   rows (one per sampled position); V vocabulary size
  T   temperature [R]; 0 means greedy: the row's distribution is one-hot at argmax(logits)
  k   top-k [R]; k <= 0 or k >= V means off. Ties with the k-th largest logit are kept.
  P   top-p [R]; keep the smallest prefix of tokens, by descending probability (ties by
      lower id first), whose mass reaches P; P >= 1 means off. The top token is always kept.
  u   uniforms in [0, 1) that the caller draws per request (see `draw_uniforms`).

Randomness is an input, not a side effect: every batched function here is a pure function
of (logits, params, uniforms). Each request owns a seeded torch.Generator and draws its
own uniforms, so its tokens do not depend on what else is in the batch; a CUDA kernel
later takes exactly the same inputs.
"""
from __future__ import annotations

from collections.abc import Sequence

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
from interlock.kernels.sampling_reference import probs_from_logits_reference, sample_from_probs_reference
from interlock.protocol.sampling import SamplingParams


def request_generator(seed: int | None, salt: int = 0) -> torch.Generator:
    """A request's own random stream: from its seed (xor salt, so one request can own several
    independent streams), or from a fresh random seed when it has none."""
    gen = torch.Generator()
    gen.manual_seed((seed if seed is not None else int(torch.randint(2**62, ()).item())) ^ salt)
    return gen


def draw_uniforms(generators: Sequence[torch.Generator], n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[R, n] float32 uniforms in [0, 1): row r is the next n draws of generators[r].

    This is the one host-side loop: one draw per request, so a request's stream of
    random numbers advances by the same n per step whatever the batch holds.
    """
    rows = [torch.rand(n, generator=g, device=g.device) for g in generators]
    if not rows:
        return torch.empty(0, n, device=device)
    return torch.stack(rows).to(device)


def probs_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Turn masked logits [R, V] into float32 probabilities [R, V].

    Applies, per row: temperature T (T == 0: one-hot at the argmax of the logits, the
    lowest id on ties), then top-k, then top-p, then softmax. -inf logits (grammar-masked)
    get probability exactly 0. A row with every logit -inf gives NaN; callers must not
    produce one. temperature and top_p are float tensors [R]; top_k is an int tensor [R].
    top_k / top_p None means off for every row: the caller knows that from the requests'
    parameters without looking at a tensor, and it saves the [R, V] sort.

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_shape("logits", logits, (None, None))
    n_rows = logits.shape[0]
    for name, t, dtypes in (("temperature", temperature, FLOAT_DTYPES), ("top_k", top_k, INDEX_DTYPES),
                            ("top_p", top_p, FLOAT_DTYPES)):
        if t is None:
            continue
        check_dtype(name, t, dtypes)
        check_shape(name, t, (n_rows,))
    check_device(logits.device, temperature=temperature, top_k=top_k, top_p=top_p)
    if resolve_backend(backend, logits.device) == "reference":
        return probs_from_logits_reference(logits, temperature, top_k, top_p)
    return _probs_torch(logits, temperature, top_k, top_p)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """Draw one token per row of probs [R, V] (weights; need not sum to 1) with u [R].

    The token is the first id whose float32 cumulative weight exceeds min(u * total, the
    largest float below total), so an id of weight 0 is never drawn. Returns int64 [R].

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    check_dtype("probs", probs, FLOAT_DTYPES)
    check_shape("probs", probs, (None, None))
    check_dtype("uniforms", uniforms, FLOAT_DTYPES)
    check_shape("uniforms", uniforms, (probs.shape[0],))
    check_device(probs.device, uniforms=uniforms)
    if resolve_backend(backend, probs.device) == "reference":
        return sample_from_probs_reference(probs, uniforms)
    return inverse_cdf(probs.float(), uniforms.float())


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    uniforms: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """probs_from_logits then sample_from_probs: int64 tokens [R]; greedy rows get the argmax."""
    probs = probs_from_logits(logits, temperature, top_k, top_p, backend=backend)
    return sample_from_probs(probs, uniforms, backend=backend)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Fast path of sample_from_probs on float32 weights [R, V] and u [R] -> int64 [R]."""
    cdf = weights.cumsum(-1)  # [R, V], non-decreasing because weights >= 0
    total = cdf[:, -1:]  # [R, 1]
    # u * total can round up to total; capping just below it keeps the draw on an id with
    # weight (the first id where cdf > target always has weight > 0).
    target = torch.minimum(u.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)  # first cdf > target
    return idx.clamp_(max=weights.shape[1] - 1)  # only an all-zero row gets here


def _probs_torch(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None) -> torch.Tensor:
    x = logits.float()  # [R, V]
    greedy = temperature <= 0  # [R]
    x = x / torch.where(greedy, 1.0, temperature.float()).unsqueeze(1)
    if top_k is not None or top_p is not None:  # static: decided by the caller, not by values
        n_rows = x.shape[0]
        k = top_k if top_k is not None else torch.zeros(n_rows, dtype=torch.long, device=x.device)
        p = top_p.float() if top_p is not None else torch.ones(n_rows, device=x.device)
        x = x.masked_fill(~_keep_top_k_top_p(x, k, p), float("-inf"))
    probs = torch.softmax(x, dim=-1)  # [R, V]
    one_hot = torch.zeros_like(probs).scatter_(1, logits.float().argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def _keep_top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean [R, V]: tokens that survive top-k then top-p (fixed shapes, no host sync)."""
    vocab = x.shape[1]
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)  # [R, V]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).long()  # [R]
    kth = sorted_x.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
    sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
    p_sorted = torch.softmax(sorted_x, dim=-1)  # [R, V]
    mass_before = p_sorted.cumsum(-1) - p_sorted  # [R, V] exclusive prefix mass
    keep_sorted = (mass_before < top_p.unsqueeze(1)) | (top_p >= 1).unsqueeze(1)
    keep_sorted &= sorted_x > float("-inf")
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)


def draw_draft(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None,
               vocab_size: int, d2t: torch.Tensor | None = None) -> tuple[int | None, torch.Tensor | None]:
    """One draft token (a target id) from one row of draft logits [Vd] (already grammar-masked).

    Returns (token, q): q [vocab_size] is the draft distribution over the target's vocabulary for a
    sampled request (verification needs it to stay exact), None for a greedy one (a point mass).
    token is None when no id is allowed (every logit -inf). d2t maps draft ids to target ids (a
    pruned draft head); ids that map to no tokenizer id, or lie past vocab_size, are never drawn.
    A sampled request needs its own `generator` (same seed, same drafts).
    """
    if d2t is None:
        logits = logits[:vocab_size]
    else:
        logits = logits.masked_fill(d2t >= vocab_size, float("-inf"))
    if not torch.isfinite(logits).any():
        return None, None
    if sampling.greedy:
        token = int(torch.argmax(logits))
        return (token if d2t is None else int(d2t[token])), None
    if generator is None:
        raise ValueError("a sampled (temperature > 0) draft needs its request's generator")
    sp = sampling
    q = probs_from_logits(logits[None].float(), torch.tensor([sp.temperature]),
                          torch.tensor([sp.top_k]) if sp.top_k else None,
                          torch.tensor([sp.top_p]) if sp.top_p else None)
    token = int(inverse_cdf(q, torch.rand(1, generator=generator))[0])
    q_target = torch.zeros(vocab_size)
    if d2t is None:
        q_target.copy_(q[0, :vocab_size])
        return token, q_target
    keep = d2t < vocab_size             # the others have q = 0 (masked above)
    q_target[d2t[keep]] = q[0, keep]
    return int(d2t[token]), q_target
