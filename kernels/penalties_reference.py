"""Slow obvious versions of kernels/penalties.py: one row and one token at a time, Python floats."""
from __future__ import annotations

import torch


def apply_penalties_reference(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                              presence: torch.Tensor, frequency: torch.Tensor,
                              repetition: torch.Tensor) -> torch.Tensor:
    out = []
    for r, row in enumerate(logits.float().tolist()):
        new = []
        for t, x in enumerate(row):
            c = int(counts[r, t])
            if bool(prompt_mask[r, t]) or c > 0:
                rep = float(repetition[r])
                x = x / rep if x > 0 else x * rep if x < 0 else x
            x = x - float(frequency[r]) * c
            if c > 0:
                x = x - float(presence[r])
            new.append(x)
        out.append(new)
    return torch.tensor(out, dtype=torch.float32, device=logits.device).reshape(logits.shape).to(logits.dtype)


def draft_counts_reference(counts: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    n_rows, vocab = counts.shape
    k = drafts.shape[1]
    out = torch.zeros(n_rows, k + 1, vocab, dtype=counts.dtype, device=counts.device)
    for b in range(n_rows):
        row = counts[b].clone()
        out[b, 0] = row
        for j in range(k):
            d = int(drafts[b, j])
            if j < int(num_drafts[b]) and 0 <= d < vocab:
                row[d] += 1
            out[b, j + 1] = row
    return out
