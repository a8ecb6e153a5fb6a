"""SamplingParams refuses every bad value at construction with InvalidParameterError naming the
field, and gives the documented meaning to the values it accepts (seeds reduced mod 2**64)."""
from __future__ import annotations

import math

import pytest

from interlock.protocol.errors import InvalidParameterError, RequestError
from interlock.protocol.sampling import MAX_STOP_STRINGS, SamplingParams

REFUSED = [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -0.5), ("temperature", 1e-9),
    ("temperature", 1e300), ("temperature", True), ("temperature", "0.7"), ("temperature", None),
    ("top_k", 0), ("top_k", -1), ("top_k", 2**70), ("top_k", 3.0), ("top_k", True), ("top_k", "5"),
    ("top_p", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.1), ("top_p", float("inf")),
    ("top_p", False), ("top_p", "0.9"),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 2**40), ("max_tokens", 10.0), ("max_tokens", True),
    ("max_tokens", "12"), ("max_tokens", None),
    ("stop", ("",)), ("stop", ""), ("stop", ("ok", "")), ("stop", ("x",) * 10_000), ("stop", (3,)),
    ("stop", ("y" * 513,)), ("stop", 7), ("stop", {"a"}),
    ("seed", True), ("seed", 1.0), ("seed", float("nan")), ("seed", "42"),
    ("ignore_eos", 1), ("ignore_eos", "yes"),
    ("guidance_scale", float("inf")), ("guidance_scale", float("nan")), ("guidance_scale", 1e300),
    ("guidance_scale", True), ("guidance_scale", "3"),
    ("presence_penalty", 2.5), ("presence_penalty", float("nan")), ("presence_penalty", -3),
    ("presence_penalty", True), ("frequency_penalty", float("-inf")), ("frequency_penalty", 2.01),
    ("frequency_penalty", "1"), ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("repetition_penalty", float("inf")), ("repetition_penalty", 1e9), ("repetition_penalty", None),
]


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={v!r}"[:40] for f, v in REFUSED])
def test_bad_values_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidParameterError) as info:
        SamplingParams(**{field: value})
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, RequestError)


ACCEPTED = [
    ("temperature", 0, 0.0), ("temperature", 1, 1.0), ("temperature", 1e-3, 1e-3), ("temperature", 1000, 1000.0),
    ("top_k", 1, 1), ("top_k", 10**6, 10**6), ("top_p", 1, 1.0), ("top_p", 1e-9, 1e-9),
    ("max_tokens", 1, 1), ("max_tokens", 2**31 - 1, 2**31 - 1),
    ("stop", "END", ("END",)), ("stop", ["a", "b"], ("a", "b")), ("stop", None, ()),
    ("stop", ("z",) * MAX_STOP_STRINGS, ("z",) * MAX_STOP_STRINGS),
    ("guidance_scale", 0, 0.0), ("guidance_scale", -2, -2.0),
    ("presence_penalty", -2, -2.0), ("frequency_penalty", 2, 2.0), ("repetition_penalty", 1.3, 1.3),
]


@pytest.mark.parametrize(("field", "value", "stored"), ACCEPTED, ids=[f"{f}={v!r}"[:40] for f, v, _ in ACCEPTED])
def test_good_values_are_stored_normalized(field: str, value: object, stored: object) -> None:
    got = getattr(SamplingParams(**{field: value}), field)
    assert got == stored and type(got) is type(stored)


@pytest.mark.parametrize(("seed", "reduced"), [
    (0, 0), (7, 7), (-1, 2**64 - 1), (2**64 - 1, 2**64 - 1), (2**64, 0), (2**70, 0), (2**70 + 5, 5),
    (-(2**80) - 1, (-(2**80) - 1) % 2**64),
])
def test_any_int_seed_is_reduced_mod_2_64(seed: int, reduced: int) -> None:
    assert SamplingParams(seed=seed).seed == reduced


def test_every_reduced_seed_seeds_a_generator() -> None:
    """What the VerifierActor does with a seed (kernels.sampling.request_generator) never overflows."""
    from interlock.kernels.sampling import request_generator

    for seed in (-1, 2**64 - 1, 2**70, -(2**100)):
        request_generator(SamplingParams(seed=seed).seed, salt=0x5EED)


def test_numpy_scalars_are_ints_and_floats() -> None:
    np = pytest.importorskip("numpy")
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(4), seed=np.uint64(2**63))
    assert p.temperature == 0.5 and p.top_k == 4 and p.seed == 2**63
    assert not math.isnan(p.temperature)


def test_penalized_flag() -> None:
    assert not SamplingParams().penalized
    assert SamplingParams(presence_penalty=0.1).penalized and SamplingParams(repetition_penalty=1.1).penalized
