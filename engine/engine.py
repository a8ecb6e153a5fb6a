"""Engine: the public facade. Loads a model, builds the runtime for its device, streams requests' output.

    async with Engine.from_pretrained("smollm2-135m-instruct", speculative="ngram+forced") as engine:
        async for delta in engine.generate(messages, grammar=JsonSchema(schema)):
            sys.stdout.write(delta.text)

Building for a device is engine/build.py, a request's way in is engine/intake.py, the options are
engine/config.py; this file starts and stops the runtime and hands requests to it.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import replace
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import anyio

from interlock.actors.grammar_layer import GrammarLayer
from interlock.engine.conditional import ConditionalTotals, run_conditional
from interlock.engine.build import Runtime, build_runtime, failure_of, scheduler_config, stop_workers
from interlock.engine.config import EngineConfig
from interlock.engine.intake import Intake, Prompt
from interlock.engine.load import draft_lm_for, for_runner, load_target
from interlock.logs import get_logger
from interlock.models.linear import WeightsChoice
from interlock.models.loader import LoadedModel
from interlock.output.stream import OutputStream
from interlock.protocol.errors import (
    ChannelClosedError, ChannelFullError, EngineClosedError, EngineError, GrammarError, InvalidParameterError,
    UnsupportedFeatureError, not_yet_on,
)
from interlock.protocol.grammar import DEFAULT_BACKEND, BackendName, GrammarConfig, GrammarSpec
from interlock.protocol.messages import Cancel, EngineMetrics, GetMetrics, GrammarReady, RequestSpec, Submit, Wake
from interlock.protocol.sampling import Completion, Delta, SamplingParams
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE, SpeculativeConfig
from interlock.protocol.types import Dtype, RequestId
from interlock.streams.timeline import HostCall
from interlock.models.names import EMBEDDED

log = get_logger(__name__)


class Engine:
    """Runs requests on one model. Use as an async context manager; see `generate` and `complete`."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()) -> None:
        loaded, self.runner = for_runner(loaded, config)     # the device forward when the device runner runs it
        self.model = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.max_context = min(config.max_context or loaded.config.max_position, loaded.config.max_position)
        self.intake = Intake(self.tokenizer, self.max_context)
        self._ids = itertools.count()
        self._streams: dict[RequestId, OutputStream[Delta]] = {}
        self._rt: Runtime | None = None
        self._closed = False                # no new requests (closed, or an actor crashed)
        self.rows_prefill: bool | None = None   # at start: prompt chunks on the rows path (EngineConfig.prefill)
        self._shut_down = False             # runtime stopped and timeline closed
        self._failure: EngineError | None = None
        self.grammars = GrammarLayer(loaded.tokenizer, loaded.config.vocab_size, config.grammar)
        self._draft_lm = draft_lm_for(loaded, config.speculative)
        self._sched_config = scheduler_config(config, loaded.config, self.max_context)
        self._conditional = ConditionalTotals()     # law="conditional" requests' attempts (metrics())

    @classmethod
    def from_pretrained(cls, name_or_path: str = EMBEDDED, *,
                        speculative: SpeculativeConfig | str | None = DEFAULT_SPECULATIVE,
                        draft_len: int = DEFAULT_DRAFT_LEN, grammar_backend: BackendName = DEFAULT_BACKEND,
                        max_batch_size: int = 8,
                        weights: WeightsChoice = "auto", kv_dtype: Dtype | None = None, tensor_parallel: int = 1,
                        device: str = "cpu", **options: Any) -> Engine:
        """Load a model (see models.loader.load_model) and build an engine around it.

        speculative: a SpeculativeConfig, a string such as "ngram+forced" / "ngram" / "forced", or None /
        "none" for one token per step. weights: "auto" (int4 for a GGUF, else int8), "int4", "int8"
        or "float" (models.loader.load_model, docs/models.md "Weights"). kv_dtype: what the KV cache
        stores (None: the loader's default, models.loader.default_kv_dtype: fp16 beside quantized
        weights where the kernels run SIMD code).
        tensor_parallel: N > 1 runs the target's forward on N worker processes, each holding 1/N of the
        weights (parallel/group.py); they start with the engine. device: "cpu" (default), "cuda", "cuda:N"
        or "auto" (CUDA when available); on CUDA the weights are loaded in bf16 (dequantized from a GGUF)
        and `weights` and `kv_dtype` do not apply. options: the other EngineConfig fields (each of its
        own type). What the config alone decides (a tensor-parallel size the model does not divide by)
        is checked before any weight is read (engine/load.py).
        """
        if isinstance(speculative, str) or speculative is None:
            speculative = SpeculativeConfig.parse(speculative, max_draft_len=draft_len)
        config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=grammar_backend),
                              max_batch_size=max_batch_size, device=device, **options)
        return cls(load_target(name_or_path, config, weights=weights, kv_dtype=kv_dtype,
                               tensor_parallel=tensor_parallel), config)

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        rt = self._rt = build_runtime(self.model, self.config, self.runner, self._sched_config, self.grammars.router,
                                      self._draft_lm, self._forget)
        self.rows_prefill = rt.rows_prefill
        await rt.start(self.model, self._sched_config, self._draft_lm, self.config, self._on_failure)
        spec = self.config.speculative
        log.info("engine_started", model=self.model.name, device=self.config.device, runner=self.runner,
                 max_batch_size=self.config.max_batch_size, speculative=spec.label if spec else "none",
                 grammar_backend=self.config.grammar.backend, kv_blocks=self._sched_config.num_blocks)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the engine: in-flight requests end with EngineClosedError. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = self._closed = True
        self._fail_all(self._failure or EngineClosedError("the engine was closed"))
        if self._rt is None or self._rt.supervisor is None:
            await anyio.to_thread.run_sync(stop_workers, self.model)        # never (or not fully) started
            return
        await self._rt.stop(self.model, self.config)

    def _on_failure(self, actor: str, exc: BaseException) -> None:
        log.error("actor_crashed", actor=actor, error=repr(exc))
        self._failure = failure_of(actor, exc)
        self._fail_all(self._failure)
        self._closed = True

    def _fail_all(self, error: EngineError) -> None:
        for stream in list(self._streams.values()):
            stream.fail(error)
        self._streams.clear()

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

        sampling.law "conditional" samples P(output | output in the grammar) exactly, by attempts
        (engine/conditional.py): nothing streams until an attempt is accepted, then its whole output;
        its stats count the attempts. The host runner runs it; the device runner refuses it by name.
        """
        return self._generate(prompt, grammar, sampling, negative_prompt, grammar_backend)

    async def complete(self, prompt: Prompt, *, grammar: GrammarSpec | None = None,
                       sampling: SamplingParams = SamplingParams(), negative_prompt: Prompt | None = None,
                       grammar_backend: BackendName | None = None) -> Completion:
        """The whole output at once."""
        deltas = [d async for d in self.generate(prompt, grammar=grammar, sampling=sampling,
                                                 negative_prompt=negative_prompt, grammar_backend=grammar_backend)]
        return Completion.of(deltas, with_logprobs=sampling.logprobs is not None)

    async def _generate(self, prompt: Prompt, grammar: GrammarSpec | None, sampling: SamplingParams,
                        negative_prompt: Prompt | None, grammar_backend: BackendName | None) -> AsyncIterator[Delta]:
        rt = self._running()
        if grammar_backend is not None:
            self.grammars.check_name(grammar_backend)
        rid = f"req-{next(self._ids)}"
        spec = self.intake.request(rid, prompt, grammar, sampling, negative_prompt)
        if sampling.law == "conditional":
            self._check_conditional(spec)
            run = lambda one: self._run(rt, one, grammar_backend)  # noqa: E731
            async for delta in run_conditional(run, spec, self.config.conditional_max_nodes, self._conditional):
                yield delta
            return
        async for delta in self._run(rt, spec, grammar_backend):
            yield delta

    def _check_conditional(self, spec: RequestSpec) -> None:
        """law="conditional" needs a grammar, and the host runner (the device runner's fixed-shape
        verification, kernels/verify.py, has no trie-adjusted target yet)."""
        if spec.grammar is None:
            raise InvalidParameterError("law", "law='conditional' conditions on a grammar: give one, or use "
                                               "law='masked'")
        if self.runner != "host":
            raise UnsupportedFeatureError("law='conditional'", not_yet_on(self.config.torch_device().type))

    async def _run(self, rt: Runtime, spec: RequestSpec, grammar_backend: BackendName | None) -> AsyncIterator[Delta]:
        """One request through the runtime, its deltas as they come."""
        rid, grammar = spec.request_id, spec.grammar
        stream: OutputStream[Delta] = OutputStream(self.config.output_buffer, on_room=lambda: self._post(Wake()),
                                                   on_cancel=lambda: self._post(Cancel(rid)))
        self._streams[rid] = stream
        submitted = False
        try:
            await rt.scheduler.send(Submit(spec, stream))
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
        scheduler = self._started().scheduler
        try:
            compiled = await self.grammars.compile(spec, backend)
        except GrammarError as exc:
            await scheduler.send(GrammarReady(rid, error=exc))
            return
        await scheduler.send(GrammarReady(rid, compiled, compile_ms=(time.perf_counter() - start) * 1e3))

    def _post(self, msg: object) -> None:
        """From the consumer's side; a full inbox is fine: the scheduler re-checks streams every step."""
        if self._closed or self._rt is None:
            return
        try:
            self._rt.scheduler.send_nowait(msg)
        except (ChannelFullError, ChannelClosedError):
            pass

    def _running(self) -> Runtime:
        """The runtime of an engine that takes requests; else its failure or EngineClosedError."""
        if self._closed or self._rt is None or self._rt.supervisor is None:
            raise self._failure or EngineClosedError("the engine is not running (use `async with engine:`)")
        return self._rt

    # --- introspection (tests, metrics) ------------------------------------------------------

    def host_trace(self) -> list[HostCall]:
        """The host functions that ran, oldest first (EngineConfig.trace_host_functions on the device
        runner; [] otherwise): name, lane, thread, start and end."""
        trace = getattr(self._rt.timeline, "host_trace", None) if self._rt is not None else None
        return trace() if trace is not None else []

    async def metrics(self) -> EngineMetrics:
        """Step counts and times since start (exposed grammar time included), and law="conditional"
        attempts (each attempt's steps and tokens count in the step totals too)."""
        metrics: EngineMetrics = await self._started().scheduler.ask(lambda r: GetMetrics(r))
        return replace(metrics, **vars(self._conditional))

    async def resources(self) -> dict[str, int]:
        """Every per-request thing any actor holds right now (each returns to 0 / to its total when
        the engine is idle): KV blocks and sequences, slots, matchers, n-gram entries, suffix tries,
        adaptive budgets, user-drafter contexts, draft-model sequences and blocks, seeded generators
        (target and draft), penalty counts, law="conditional" attempts' walks, compiled grammars kept
        for unadmitted requests, output streams, requests, a step in flight (a release sent during a
        step takes effect at its end).
        Kept across requests, bounded: the prefix cache's blocks (kv_cached_blocks; they count as
        free, since eviction reclaims them) and the global suffix trie (suffix_global_*).
        The KV pool's invariants (refcounts = block-table references) are checked on every call."""
        res = await self._started().resources()
        res["engine_streams"] = len(self._streams)
        return res

    def _started(self) -> Runtime:
        """The runtime, for questions about it (it may have stopped taking requests)."""
        if self._rt is None:
            raise EngineClosedError("the engine was never started (use `async with engine:`)")
        return self._rt
