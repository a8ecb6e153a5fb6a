"""hypothesis over the public API: random SamplingParams (extreme floats and ints, wrong types) and
random grammar specs. Each request either raises a typed error (InterlockError) before or at
submission, or completes with an output that satisfies its grammar when it ends with "stop". The
engine never closes: every batch of requests runs on one engine, which then still serves."""
from __future__ import annotations

import json
import math
import re

import anyio
import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.engine import Engine
from interlock.protocol.errors import EngineError, InterlockError
from interlock.protocol.grammar import Choice, JsonObject, JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams

from helpers import assert_all_free, config, wait_idle

WEIRD_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -0.0, 1e-3, 1e-9, 1e3, 1e300, -1.0, 0.5, 1.0, 2.0, math.nan, math.inf]))
WEIRD_INTS = st.one_of(st.integers(-2**80, 2**80), st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63, 2**64]))
ANYTHING = st.one_of(st.none(), st.booleans(), st.text(max_size=3), WEIRD_FLOATS, WEIRD_INTS)

SAMPLING_FIELDS = {
    "temperature": st.one_of(WEIRD_FLOATS, ANYTHING), "top_k": st.one_of(st.none(), WEIRD_INTS, ANYTHING),
    "top_p": st.one_of(st.none(), WEIRD_FLOATS, ANYTHING), "max_tokens": st.one_of(st.integers(1, 12), ANYTHING),
    "seed": st.one_of(st.none(), WEIRD_INTS, ANYTHING), "stop": st.one_of(
        st.lists(st.text(max_size=3), max_size=3), ANYTHING),
    "guidance_scale": st.one_of(st.none(), WEIRD_FLOATS), "presence_penalty": WEIRD_FLOATS,
    "frequency_penalty": WEIRD_FLOATS, "repetition_penalty": WEIRD_FLOATS, "ignore_eos": ANYTHING,
}


@st.composite
def sampling_kwargs(draw) -> dict:
    names = draw(st.sets(st.sampled_from(sorted(SAMPLING_FIELDS)), max_size=4))
    kwargs = {name: draw(SAMPLING_FIELDS[name]) for name in names}
    kwargs.setdefault("max_tokens", draw(st.integers(1, 12)))
    return kwargs


PRINTABLE = "abcxyz XYZ019{}\"':,.-_"
LEAF_SCHEMAS = st.sampled_from([
    {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "null"}, {"enum": ["a", 1, None]},
    {"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}, {"const": "x"},
    {"type": "no-such-type"}, {"type": "string", "format": "no-such-format"}, {"type": "string", "pattern": "("},
])
SCHEMAS = st.recursive(LEAF_SCHEMAS, lambda inner: st.one_of(
    st.builds(lambda items: {"type": "array", "items": items, "maxItems": 2}, inner),
    st.builds(lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]},
              st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)),
    st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=2))), max_leaves=6)
GRAMMARS = st.one_of(
    st.none(), st.just(JsonObject()), st.builds(JsonSchema, SCHEMAS),
    st.builds(Regex, st.one_of(st.sampled_from(["[a-z]{1,5}", "(ab|cd)+", "x?y*", "(", "[z-a]", "a{3,1}"]),
                               st.text(alphabet="ab()[]*+?|{}019-", max_size=6))),
    # Any text: a choice no token can start (Choice(["\x16"]) on the tiny vocabulary) gives an
    # all-masked row, which must fail that request alone (SamplingError), never the engine.
    st.builds(Choice, st.lists(st.one_of(st.text(alphabet=PRINTABLE, max_size=4), st.text(max_size=3)), max_size=3)))


def _satisfies(grammar, text: str) -> None:
    if isinstance(grammar, JsonSchema):
        jsonschema.validate(json.loads(text), json.loads(grammar.compiled_schema))
    elif isinstance(grammar, JsonObject):
        assert isinstance(json.loads(text), dict)
    elif isinstance(grammar, Regex):
        assert re.fullmatch(grammar.pattern, text), (grammar.pattern, text)
    elif isinstance(grammar, Choice):
        assert text in grammar.options, (grammar.options, text)


async def _batch(tiny, requests: list[tuple[object, dict]]) -> None:
    async with Engine(tiny, config(4)) as engine:

        async def one(grammar, kwargs: dict) -> None:
            try:
                sampling = SamplingParams(**kwargs)
                c = await engine.complete("JSON please", grammar=grammar, sampling=sampling)
            except EngineError:
                raise                                   # the engine must never fail
            except InterlockError:
                return                                  # a typed error for this request only
            if c.finish_reason == "stop" and grammar is not None and not sampling.stop:
                _satisfies(grammar, c.text)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for grammar, kwargs in requests:
                    tg.start_soon(one, grammar, kwargs)
        await wait_idle(engine)
        await assert_all_free(engine)
        assert (await engine.complete("still up?", sampling=SamplingParams(max_tokens=3))).finish_reason


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(GRAMMARS, sampling_kwargs()), min_size=1, max_size=8))
def test_random_requests_get_typed_errors_or_valid_outputs_and_the_engine_stays_up(tiny, requests) -> None:
    anyio.run(_batch, tiny, requests)
