"""Engine: the public facade. Loads a model, builds the runtime for its device, streams requests' output.

    async with Engine.from_pretrained("smollm2-135m-instruct", speculative="ngram+forced") as engine:
        async for delta in engine.generate(messages, grammar=JsonSchema(schema)):
            sys.stdout.write(delta.text)

Building for a device is engine/build.py, a request's way in is engine/intake.py, the options are
engine/config.py; this file starts and stops the runtime and hands requests to it.
"""
from __future__ import annotations

import gc
import itertools
import time
from collections.abc import AsyncIterator
from types import TracebackType

import anyio

from interlock.actors.grammar_layer import GrammarLayer
from interlock.actors.runtime import Runtime as ActorRuntime
from interlock.engine.build import (
    Runtime, build_runtime, draft_lm_for, for_runner, scheduler_config, start_workers, stop_workers,
)
from interlock.engine.config import EngineConfig
from interlock.engine.intake import EMPTY_CHAT, Intake, Prompt
from interlock.logs import get_logger
from interlock.models.linear import Weights
from interlock.models.loader import LoadedModel, load_model
from interlock.output.stream import OutputStream
from interlock.parallel.group import load_tensor_parallel
from interlock.protocol.errors import EngineClosedError, EngineError, GrammarError
from interlock.protocol.grammar import DEFAULT_BACKEND, BackendName, GrammarConfig, GrammarSpec
from interlock.protocol.messages import (
    Cancel, Count, EngineMetrics, GetMetrics, GrammarReady, KVUsage, RequestSpec, Submit, Wake,
)
from interlock.protocol.sampling import Completion, Delta, SamplingParams
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE, SpeculativeConfig
from interlock.protocol.types import Dtype, RequestId
from interlock.streams.errors import ChannelClosedError, ChannelFullError

log = get_logger(__name__)


def _engine_error_in(exc: BaseException | None) -> EngineError | None:
    """The innermost EngineError in exc's chain of causes: a lane wraps what its function raised
    (TimelineError around a WorkerError), and the innermost one says what failed."""
    found, seen = None, 0
    while exc is not None and seen < 8:
        if isinstance(exc, EngineError):
            found = exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return found


class Engine:
    """Runs requests on one model. Use as an async context manager; see `generate` and `complete`."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()) -> None:
        loaded, self.runner = for_runner(loaded, config)     # the device forward when the device runner runs it
        self.model = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.max_context = min(config.max_context or loaded.config.max_position, loaded.config.max_position)
        self.intake = Intake(self.tokenizer, self.max_context, device_runner=self.runner == "device")
        self._ids = itertools.count()
        self._streams: dict[RequestId, OutputStream[Delta]] = {}
        self._actors_runtime: ActorRuntime | None = None
        self._rt: Runtime | None = None
        self._closed = False                # no new requests (closed, or an actor crashed)
        self.rows_prefill: bool | None = None   # at start: prompt chunks on the rows path (EngineConfig.prefill)
        self._shut_down = False             # runtime stopped and timeline closed
        self._failure: EngineError | None = None
        self.grammars = GrammarLayer(loaded.tokenizer, loaded.config.vocab_size, config.grammar)
        self._draft_lm = draft_lm_for(loaded, config.speculative)
        self._sched_config = scheduler_config(config, loaded.config, self.max_context)

    @classmethod
    def from_pretrained(cls, name_or_path: str = "smollm2-135m-instruct", *,
                        speculative: SpeculativeConfig | str | None = DEFAULT_SPECULATIVE,
                        draft_len: int = DEFAULT_DRAFT_LEN, grammar_backend: BackendName = DEFAULT_BACKEND,
                        max_batch_size: int = 8,
                        weights: Weights = "int8", kv_dtype: Dtype | None = None, tensor_parallel: int = 1,
                        device: str = "cpu", **options: object) -> Engine:
        """Load a model (see models.loader.load_model) and build an engine around it.

        speculative: a SpeculativeConfig, a string such as "ngram+forced" / "ngram" / "forced", or
        None / "none" for one token per step. kv_dtype: what the KV cache stores (None: the
        loader's default, fp16 beside int8 weights on AVX-512 CPUs). tensor_parallel: N > 1 runs the target's
        forward on N worker processes, each holding 1/N of the weights (parallel/group.py); they
        start with the engine. device: "cpu" (default), "cuda", "cuda:N" or "auto" (CUDA when
        available); on CUDA the weights are loaded in bf16 (dequantized from a GGUF) and `weights`
        and `kv_dtype` do not apply. options: the other EngineConfig fields.
        """
        if isinstance(speculative, str) or speculative is None:
            speculative = SpeculativeConfig.parse(speculative, max_draft_len=draft_len)
        config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=grammar_backend),
                              max_batch_size=max_batch_size, device=device, **options)  # type: ignore[arg-type]
        target = config.torch_device()
        if config.runner_for(target) == "device":
            # float weights for the device forward, in the dtype it computes in (for_runner moves them)
            dtype = "bfloat16" if target.type == "cuda" else "float32"
            return cls(load_model(name_or_path, weights="float", dtype=dtype), config)
        if tensor_parallel > 1:
            return cls(load_tensor_parallel(name_or_path, tensor_parallel, weights=weights, kv_dtype=kv_dtype), config)
        return cls(load_model(name_or_path, weights=weights, kv_dtype=kv_dtype), config)

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        loaded = self.model
        rt = self._rt = build_runtime(loaded, self.config, self.runner, self._sched_config, self.grammars.router,
                                      self._draft_lm, self._forget)
        self.rows_prefill = rt.rows_prefill
        try:
            await anyio.to_thread.run_sync(start_workers, loaded, self._sched_config, self._draft_lm, self.config)
        except BaseException:
            rt.close()
            raise
        self._actors_runtime = ActorRuntime(list(rt.actors), on_failure=self._on_failure)
        await self._actors_runtime.__aenter__()
        if self.config.freeze_gc:
            gc.collect(1)
            gc.freeze()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the engine: in-flight requests end with EngineClosedError. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = self._closed = True
        for stream in list(self._streams.values()):
            stream.fail(self._failure or EngineClosedError("the engine was closed"))
        self._streams.clear()
        if self._actors_runtime is None:
            await anyio.to_thread.run_sync(stop_workers, self.model)
            return                      # never entered
        try:
            await self._actors_runtime.__aexit__(None, None, None)
        except EngineError:
            pass                        # already reported to every request
        finally:
            if self.config.freeze_gc:
                gc.unfreeze()
            await anyio.to_thread.run_sync(stop_workers, self.model)
            assert self._rt is not None
            self._rt.close()

    def _on_failure(self, actor: str, exc: BaseException) -> None:
        log.error("actor_crashed", actor=actor, error=repr(exc))
        cause = _engine_error_in(exc)
        if cause is not None:               # e.g. a WorkerError under the timeline's error: it says what failed
            self._failure = cause
        else:
            self._failure = EngineError(f"the engine failed: actor {actor} crashed: {exc!r}")
            self._failure.__cause__ = exc
        for stream in list(self._streams.values()):
            stream.fail(self._failure)
        self._streams.clear()
        self._closed = True

    def _forget(self, request_id: RequestId) -> None:
        self._streams.pop(request_id, None)

    # --- requests ----------------------------------------------------------------------------

    def generate(self, prompt: Prompt, *, grammar: GrammarSpec | None = None,
                 sampling: SamplingParams = SamplingParams(), negative_prompt: Prompt | None = None,
                 grammar_backend: BackendName | None = None) -> AsyncIterator[Delta]:
        """Stream the output as Deltas; the last one has finish_reason and stats.

        With sampling.guidance_scale set (classifier-free guidance), negative_prompt is the
        unconditional prompt, a plain string or chat messages like `prompt`; None: the chat
        template around an empty user message. The request then holds two KV sequences (twice
        the blocks) and each step forwards both in one packed batch.

        prompt: a string (encoded as is), chat messages (through the chat template), or token ids
        (a sequence of ints, each in [0, tokenizer vocabulary), used as they are).
        grammar_backend: "xgrammar", "llguidance" or "auto" compiles this request's grammar with
        that backend; None: the engine's (EngineConfig.grammar.backend).

        Leaving the loop early, closing the iterator or cancelling the consuming task cancels the
        request and frees everything it held. Raises a RequestError subclass (bad prompt, grammar,
        capacity) for this request only, EngineError if the engine fails or is closed.
        """
        return self._generate(prompt, grammar, sampling, negative_prompt, grammar_backend)

    async def complete(self, prompt: Prompt, *, grammar: GrammarSpec | None = None,
                       sampling: SamplingParams = SamplingParams(), negative_prompt: Prompt | None = None,
                       grammar_backend: BackendName | None = None) -> Completion:
        """The whole output at once."""
        text, thought, ids, logprobs, last = [], [], [], [], None
        async for delta in self.generate(prompt, grammar=grammar, sampling=sampling, negative_prompt=negative_prompt,
                                         grammar_backend=grammar_backend):
            text.append(delta.text)
            thought.append(delta.reasoning_text)
            ids.extend(delta.token_ids)
            logprobs.extend(delta.logprobs or ())
            last = delta
        assert last is not None and last.finish_reason is not None and last.stats is not None
        return Completion("".join(text), tuple(ids), last.finish_reason, last.stats, "".join(thought),
                          tuple(logprobs) if sampling.logprobs is not None else None)

    async def _generate(self, prompt: Prompt, grammar: GrammarSpec | None, sampling: SamplingParams,
                        negative_prompt: Prompt | None, grammar_backend: BackendName | None) -> AsyncIterator[Delta]:
        if self._closed or self._actors_runtime is None:
            raise self._failure or EngineClosedError("the engine is not running (use `async with engine:`)")
        self.intake.check(grammar, sampling, negative_prompt)
        if grammar_backend is not None:
            self.grammars.check_name(grammar_backend)
        tokens = self.intake.encode(prompt, grammar)
        uncond = None
        if sampling.guidance_scale is not None:
            uncond = self.intake.encode(negative_prompt if negative_prompt is not None else EMPTY_CHAT, grammar)
        rid = f"req-{next(self._ids)}"
        stream: OutputStream[Delta] = OutputStream(self.config.output_buffer, on_room=self._wake,
                                                   on_cancel=lambda: self._cancel(rid))
        self._streams[rid] = stream
        spec = RequestSpec(rid, tuple(tokens), grammar, sampling, tuple(uncond) if uncond is not None else None)
        submitted = False
        try:
            await self._rt.scheduler.send(Submit(spec, stream))
            submitted = True
            if grammar is not None:
                await self._compile(rid, grammar, grammar_backend)
            async for delta in stream:
                yield delta
        except ChannelClosedError as exc:
            raise self._failure or EngineClosedError("the engine was closed") from exc
        finally:
            stream.cancel()
            if not submitted:               # cancelled before the scheduler got it: nobody else forgets it
                self._streams.pop(rid, None)

    async def _compile(self, rid: RequestId, spec: GrammarSpec, backend: BackendName | None) -> None:
        """Compile in this request's own task (a worker thread underneath), while its prompt prefills."""
        start = time.perf_counter()
        try:
            compiled = await self.grammars.compile(spec, backend)
        except GrammarError as exc:
            await self._rt.scheduler.send(GrammarReady(rid, error=exc))
            return
        await self._rt.scheduler.send(GrammarReady(rid, compiled, compile_ms=(time.perf_counter() - start) * 1e3))

    def _wake(self) -> None:
        self._post(Wake())

    def _cancel(self, rid: RequestId) -> None:
        self._post(Cancel(rid))

    def _post(self, msg: object) -> None:
        """From the consumer's side; a full inbox is fine: the scheduler re-checks streams every step."""
        if self._closed:
            return
        try:
            self._rt.scheduler.send_nowait(msg)
        except (ChannelFullError, ChannelClosedError):
            pass

    # --- introspection (tests, metrics) ------------------------------------------------------

    async def metrics(self) -> EngineMetrics:
        """Step counts and times since start (exposed grammar time included)."""
        return await self._rt.scheduler.ask(lambda r: GetMetrics(r))

    async def resources(self) -> dict[str, int]:
        """Every per-request thing any actor holds right now (each returns to 0 / to its total when
        the engine is idle): KV blocks and sequences, slots, matchers, n-gram entries, suffix tries,
        adaptive budgets, user-drafter contexts, draft-model sequences and blocks, seeded generators
        (target and draft), penalty counts, compiled grammars kept for unadmitted requests, output
        streams, requests. Kept across requests, bounded: the prefix cache's blocks (kv_cached_blocks;
        they count as free, since eviction reclaims them) and the global suffix trie (suffix_global_*).
        The KV pool's invariants (refcounts = block-table references) are checked on every call."""
        kv_actor, verifier, grammar, draft, scheduler = self._rt.actors
        free, total, seqs, cached = await kv_actor.ask(lambda r: KVUsage(r))
        generators, penalties = await verifier.ask(lambda r: Count(r))
        res = {"kv_free_blocks": free, "kv_total_blocks": total, "kv_sequences": seqs, "kv_cached_blocks": cached,
               "matchers": await grammar.ask(lambda r: Count(r)),
               "verify_generators": generators, "penalty_entries": penalties}
        res.update(await draft.ask(lambda r: Count(r)))
        res.update(await scheduler.ask(lambda r: Count(r)))
        res["engine_streams"] = len(self._streams)
        return res
