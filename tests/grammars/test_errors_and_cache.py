"""Bad input raises GrammarError naming the backend(s); the compile cache dedups, evicts, times out."""
from __future__ import annotations

import threading
import time

import anyio
import pytest

from interlock.actors.compile_cache import CompileCache
from interlock.actors.grammar_layer import GrammarLayer
from interlock.grammars import make_backend
from interlock.grammars.compiled import CompiledGrammar
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Choice, Ebnf, GrammarConfig, JsonSchema, Lark, Regex

NAMES = ("xgrammar", "llguidance")


def test_invalid_json_schema_text():
    with pytest.raises(GrammarError, match="not valid JSON"):
        JsonSchema("{not json")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spec", [Regex("(unclosed"), Ebnf("root ::= (("), Lark("start: ((("),
                                  JsonSchema({"type": "no-such-type"}), Choice([])],
                         ids=["regex", "ebnf", "lark", "schema", "empty-choice"])
def test_malformed_specs_name_the_backend(name, spec, tiny_backends):
    with pytest.raises(GrammarError) as info:
        tiny_backends[name].compile(spec)
    # an empty choice and a schema that its meta-schema refuses fail the shared checks, before any backend
    assert name in str(info.value) or isinstance(spec, (Choice, JsonSchema))


@pytest.mark.parametrize("schema, where", [({"type": "objekt"}, "/type"),
                                           ({"properties": {"a": {"type": "strin"}}}, "/properties/a/type"),
                                           ({"type": "object", "required": "a"}, "/required")])
def test_a_schema_typo_is_named_as_one_without_suggesting_lenient(schema, where, tiny_backends):
    """lenient=True would not help: the meta-schema refuses the schema, so no output could validate."""
    with pytest.raises(GrammarError) as info:
        tiny_backends["auto"].compile(JsonSchema(schema))
    message = str(info.value)
    assert f"not a valid schema at {where}:" in message and "lenient" not in message


@pytest.mark.parametrize("pattern, why", [("a(b", "unclosed group"), ("[z-a]", "invalid character class range")])
def test_llguidance_regex_errors_say_why_on_one_line(pattern, why, tiny_backends):
    """Its message spans lines (the pattern echoed, a caret line, then the reason): kept whole, on one line."""
    with pytest.raises(GrammarError) as info:
        tiny_backends["llguidance"].compile(Regex(pattern))
    message = str(info.value)
    assert "regex parse error: " + why in message and "\n" not in message


def test_auto_names_both_reasons_only_when_both_fail(tiny_backends):
    auto = tiny_backends["auto"]
    with pytest.raises(GrammarError) as info:
        auto.compile(Regex("(unclosed"))
    assert "llguidance:" in str(info.value) and "xgrammar:" in str(info.value)
    compiled = auto.compile(Ebnf('start ::= "x"', root="start"))     # llguidance refuses, xgrammar compiles
    assert compiled.backend == "xgrammar" and "llguidance" in compiled.tried[0]


def test_caps_are_configurable(tiny_tokenizer):
    deep = {"type": "object", "properties": {}}
    node = deep
    for _ in range(10):
        node["properties"]["x"] = {"type": "object", "properties": {}}
        node = node["properties"]["x"]
    small = GrammarConfig(max_schema_depth=8, max_schema_bytes=1000)
    for name in NAMES:
        backend = make_backend(name, tiny_tokenizer, 1088, small)
        with pytest.raises(GrammarError, match="max_schema_depth"):
            backend.compile(JsonSchema(deep))
        with pytest.raises(GrammarError, match="max_schema_bytes"):
            backend.compile(Choice(["x" * 2000]))
        make_backend(name, tiny_tokenizer, 1088, GrammarConfig(max_schema_depth=64)).compile(JsonSchema(deep))


class FakeBackend:
    """Compiles by sleeping; counts compiles per key; `slow` keys take `slow_s`."""

    name = "fake"
    vocab_size = 64

    def __init__(self, slow_s: float = 0.0) -> None:
        self.calls: dict[str, int] = {}
        self.slow_s = slow_s
        self.lock = threading.Lock()

    def compile(self, spec):
        with self.lock:
            self.calls[spec.key] = self.calls.get(spec.key, 0) + 1
        if spec.key.startswith("regex:slow"):
            time.sleep(self.slow_s)
        if spec.key.startswith("regex:bad"):
            raise GrammarError("fake: bad")
        time.sleep(0.02)
        return CompiledGrammar(self.name, spec.key, object())


async def test_concurrent_requests_compile_once():
    with anyio.fail_after(10):
        backend = FakeBackend()
        cache = CompileCache(backend, "tok", max_entries=4)
        results = []

        async def get():
            results.append(await cache.get(Regex("a")))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(get)
        assert backend.calls == {"regex:a": 1}
        assert all(r is results[0] for r in results)
        assert cache.stats().misses == 1


async def test_lru_evicts_and_failures_are_not_cached():
    with anyio.fail_after(10):
        backend = FakeBackend()
        cache = CompileCache(backend, "tok", max_entries=2)
        for p in ("a", "b", "a", "c"):          # "b" is least recently used when "c" arrives
            await cache.get(Regex(p))
        await cache.get(Regex("a"))
        await cache.get(Regex("b"))
        assert backend.calls == {"regex:a": 1, "regex:b": 2, "regex:c": 1}
        for _ in range(2):
            with pytest.raises(GrammarError, match="fake: bad"):
                await cache.get(Regex("bad"))
        assert backend.calls["regex:bad"] == 2


async def test_timeout_is_a_grammar_error_and_blocks_no_other_compile():
    with anyio.fail_after(10):
        backend = FakeBackend(slow_s=1.5)
        cache = CompileCache(backend, "tok", timeout_s=0.3)
        done_fast = anyio.Event()

        async def slow():
            with pytest.raises(GrammarError, match="timed out after 0.3 s"):
                await cache.get(Regex("slow"))

        async def fast():
            await cache.get(Regex("fast"))
            done_fast.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(fast)
            await done_fast.wait()
        assert cache.stats().entries == 1


async def test_layer_compiles_real_grammars_off_the_loop(tiny_tokenizer):
    with anyio.fail_after(30):
        layer = GrammarLayer(tiny_tokenizer, 1088, GrammarConfig(backend="auto"))
        m = await layer.matcher(Regex("[0-9]{3}"))
        assert m.accept(tiny_tokenizer.encode("123")) and m.is_accepting()
        with pytest.raises(GrammarError):
            await layer.compile(Regex("(oops"))
