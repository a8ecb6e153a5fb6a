"""The device runner's per-request features (classifier-free guidance, repetition penalties,
logprobs): which a step uses (its part of the step's shape), their per-lane inputs in pinned
host buffers and their device copies, and the logprobs copied back (the penalty counts are
kernels/penalty_book.py's, the book both runners keep) (kernels/verify_features.py is the device work they feed).

A step's shape names only the features its verified requests use, so a step without them stages,
copies and computes nothing more than before (and replays the same program):
- guides: the companions' row sets (one per guided request; padded to a batch bucket on a
  captured shape), laid after the requests' rows in the forward;
- penalties: on or off;
- logprobs: N alternatives, rounded up to LOGPROB_BUCKETS (0: the token's own alone, no sort).

Terms as in actors/device/staging.py (B verified requests, K draft length).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

import torch

from interlock.actors.device.staging import numpy_views
from interlock.kernels.penalty_book import PenaltyBook
from interlock.kernels.types import Logprobs
from interlock.kernels.verify_features import Features, GuideInputs, PenaltyInputs
from interlock.protocol.messages import RequestSnapshot
from interlock.protocol.sampling import MAX_LOGPROBS, TokenLogprob
from interlock.protocol.types import TokenId

LOGPROB_BUCKETS = (0, 5, MAX_LOGPROBS)      # alternatives a step computes: few programs per bucket


@dataclass(frozen=True)
class FeatureShape:
    """The features part of a step's shape (module docstring)."""

    guides: int = 0
    penalties: bool = False
    logprobs: int | None = None


def feature_shape(sampled: Sequence[RequestSnapshot], pad: Callable[[int], int] | None) -> FeatureShape:
    """What the step's sampling requests use; `pad` rounds the guide count up to a bucket."""
    guided = sum(1 for s in sampled if s.guide is not None)
    asked = [s.sampling.logprobs for s in sampled if s.sampling.logprobs is not None]
    return FeatureShape(pad(guided) if guided and pad is not None else guided,
                        any(s.sampling.penalized for s in sampled),
                        next(n for n in LOGPROB_BUCKETS if n >= max(asked)) if asked else None)


class FeatureStaging:
    """Host (pinned on CUDA) and device copies of the features' per-lane inputs, and the pinned
    host copy of the logprobs (every buffer allocated once, at full capacity)."""

    def __init__(self, *, batch: int, k: int, device: torch.device, penalties: PenaltyBook) -> None:
        pin = device.type == "cuda"
        self.k, self.penalties = k, penalties

        def make(where: torch.device) -> tuple[GuideInputs, PenaltyInputs]:
            def z(dtype: torch.dtype, fill: float = 0) -> torch.Tensor:
                return torch.full((batch,), fill, dtype=dtype, device=where, pin_memory=pin and where.type == "cpu")

            f32 = torch.float32
            return (GuideInputs(z(torch.int64), z(f32, 1.0)),
                    PenaltyInputs(z(torch.int64), z(torch.bool), z(f32), z(f32), z(f32, 1.0)))

        (self.host_guide, self.host_penalty), (self.dev_guide, self.dev_penalty) = make(torch.device("cpu")), \
            make(device)
        self.np_guide, self.np_penalty = numpy_views(self.host_guide), numpy_views(self.host_penalty)
        self.out = Logprobs(*(torch.zeros(shape, dtype=dtype, pin_memory=pin) for shape, dtype in (
            ((batch, k + 1), torch.float32), ((batch, k + 1, MAX_LOGPROBS), torch.int64),
            ((batch, k + 1, MAX_LOGPROBS), torch.float32))))
        self.np_out = numpy_views(self.out)

    # --- the prologue (event loop) -------------------------------------------------------------

    def stage(self, shape: FeatureShape, batch: int, lanes: Sequence[tuple[int, RequestSnapshot]],
              companions: dict[int, int]) -> None:
        """Each lane's guide and penalty inputs, where the step uses them; `lanes` are the (lane,
        request) pairs verified, `companions` each guided lane's companion."""
        if shape.guides:
            g = self.np_guide
            g["companion"][:batch], g["scale"][:batch] = 0, 1.0
            for lane, s in lanes:
                if lane in companions:
                    g["companion"][lane] = companions[lane]
                    g["scale"][lane] = 1.0 if s.sampling.guidance_scale is None else s.sampling.guidance_scale
        if shape.penalties:
            p = self.np_penalty
            p["row"][:batch], p["penalized"][:batch] = self.penalties.zero_row, False
            p["presence"][:batch], p["frequency"][:batch], p["repetition"][:batch] = 0.0, 0.0, 1.0
            for lane, s in lanes:
                if s.sampling.penalized:
                    p["row"][lane], p["penalized"][lane] = self.penalties.row(s.request_id), True
                    p["presence"][lane] = s.sampling.presence_penalty
                    p["frequency"][lane] = s.sampling.frequency_penalty
                    p["repetition"][lane] = s.sampling.repetition_penalty

    # --- device work -----------------------------------------------------------------------------

    def upload(self, shape: FeatureShape, batch: int) -> Features:
        """Copy the inputs of the features the step uses; the verification reads the returned views."""
        guide = _upload(self.host_guide, self.dev_guide, batch) if shape.guides else None
        penalties = None
        if shape.penalties:
            assert self.penalties.counts is not None, "a penalized request's add precedes its steps"
            penalties = (_upload(self.host_penalty, self.dev_penalty, batch), self.penalties.counts)
        return Features(guide, penalties, shape.logprobs)

    def download(self, lp: Logprobs, batch: int, n: int) -> None:
        self.out.token[:batch].copy_(lp.token, non_blocking=True)
        self.out.top_ids[:batch, :, :n].copy_(lp.top_ids, non_blocking=True)
        self.out.top[:batch, :, :n].copy_(lp.top, non_blocking=True)

    # --- the step's tail (a host function) ---------------------------------------------------------

    def logprobs(self, lane: int, tokens: Sequence[TokenId], n: int) -> tuple[TokenLogprob, ...]:
        """A lane's emitted tokens with their log-probabilities and n alternatives each."""
        o, used = self.np_out, len(tokens)
        return tuple(map(TokenLogprob.from_row, tokens, o["token"][lane, :used].tolist(),
                         o["top_ids"][lane, :used, :n].tolist(), o["top"][lane, :used, :n].tolist(), [n] * used))


# The input sets staged here: dataclasses of [B] tensors, one copied field by field.
Inputs = TypeVar("Inputs", GuideInputs, PenaltyInputs)


def _upload(host: Inputs, dev: Inputs, batch: int) -> Inputs:
    views: dict[str, torch.Tensor] = {}
    for f in fields(host):
        view = getattr(dev, f.name)[:batch]
        view.copy_(getattr(host, f.name)[:batch], non_blocking=True)
        views[f.name] = view
    return type(host)(**views)
