"""The chi-square goodness-of-fit p-value the statistical exactness tests share."""
from __future__ import annotations

import torch


def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """P-value of observed counts [N] against probabilities [N]; bins under 5 expected are pooled."""
    total = float(observed.sum())
    exp = expected.double() * total
    big = exp >= 5
    obs_bins, exp_bins = observed[big].double().tolist(), exp[big].tolist()
    pooled_obs, pooled_exp = float(observed[~big].sum()), float(exp[~big].sum())
    if pooled_exp >= 5:
        obs_bins.append(pooled_obs)
        exp_bins.append(pooled_exp)
    elif pooled_exp > 0 or pooled_obs > 0:  # too small to stand alone: join the smallest bin
        i = min(range(len(exp_bins)), key=exp_bins.__getitem__)
        obs_bins[i] += pooled_obs
        exp_bins[i] += pooled_exp
    df = len(exp_bins) - 1
    if df == 0:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_bins, exp_bins))
    # chi2 survival function = regularized upper incomplete gamma Q(df/2, stat/2).
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
