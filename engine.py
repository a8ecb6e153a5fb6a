"""Engine: the public facade. Loads a model, wires the five actors, streams requests' output.

    async with Engine.from_pretrained("smollm2-135m-instruct", speculative="ngram+forced") as engine:
        async for delta in engine.generate(messages, grammar=JsonSchema(schema)):
            sys.stdout.write(delta.text)
"""
from __future__ import annotations

import gc
import itertools
import math
import numbers
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType

import anyio
import torch

from interlock.actors.draft_actor import DraftActor
from interlock.actors.grammar_actor import GrammarActor, MaskBuffers
from interlock.actors.kv_actor import KVActor
from interlock.actors.runtime import Runtime
from interlock.actors.scheduler import Scheduler, SchedulerConfig
from interlock.actors.step import StepBuffers, StepProgram
from interlock.actors.verifier_actor import VerifierActor
from interlock.actors.grammar_layer import GrammarLayer
from interlock.models.generate import check_prompt_fits
from interlock.drafters.model import DraftLM, ModelDrafter
from interlock.models.kv_cache import PagedKVCache, block_bytes
from interlock.models.linear import Weights
from interlock.models.loader import LoadedModel, load_model
from interlock.models.tp_group import TensorParallelModel, TPConfig, load_tensor_parallel
from interlock.models.tokenizer import Message
from interlock.protocol.errors import (
    EmptyPromptError, EngineClosedError, EngineError, GrammarError, InterlockError, InvalidParameterError,
    PromptTooLongError, RequestError,
    UnsupportedModelError,
)
from interlock.protocol.grammar import BackendName, GrammarConfig, GrammarSpec
from interlock.protocol.messages import (
    Cancel, Count, EngineMetrics, GetMetrics, GrammarReady, KVUsage, RequestSpec, Submit, Wake,
)
from interlock.protocol.sampling import Completion, Delta, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import Dtype, RequestId
from interlock.streams.channel import ChannelClosedError
from interlock.streams.cpu_timeline import CpuTimeline
from interlock.streams.errors import ChannelFullError
from interlock.streams.output import OutputStream
from interlock.logs import get_logger

log = get_logger(__name__)

Prompt = str | Sequence[Message] | Sequence[int]   # text, chat messages, or token ids


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine is built with (validated here, never mutated)."""

    speculative: SpeculativeConfig | None = SpeculativeConfig()
    grammar: GrammarConfig = GrammarConfig()
    max_batch_size: int = 8
    num_kv_blocks: int | None = None        # None: enough for max_batch_size full contexts, within kv_cache_bytes
    kv_cache_bytes: int = 1 << 30           # cap on the pool when num_kv_blocks is None (vLLM sizes it by memory too)
    block_size: int = 16
    prefill_chunk: int = 256
    max_step_tokens: int = 512
    output_buffer: int = 16                 # deltas a slow consumer may leave unread before its request pauses
    capture_steps: bool = True              # replay one captured lane program per step shape (else eager)
    max_context: int | None = None          # None: the model's context window
    tp_step_timeout_s: float = 60.0         # tensor parallel: a step taking longer means a hung worker
    # Share the K/V of full prompt blocks between requests (models/prefix_cache.py): a request whose
    # prompt starts with a cached prefix skips prefilling it. Outputs are the same either way.
    # Not yet under tensor parallelism (untested there): off when tensor_parallel > 1.
    prefix_caching: bool = True
    # torch intra-op threads of the model lane. Each thread that runs torch ops in parallel keeps an
    # OpenMP pool of its own, and two pools on a small machine make each parallel op wait for
    # sleeping workers (decode 2x slower: benchmarks/thread_check.py). None: min(2, cores) when the
    # thread that starts the engine runs torch at 1 thread (`torch.set_num_threads(1)` before
    # loading, as the CLI does), else 1 (that thread's pool is then the only one).
    threads: int | None = None
    # How prompt chunks are computed. "rows": on the int8 rows path every decode step takes, batch
    # invariant, so a prefix-cache hit may end at any block and cover earlier outputs (multi-turn);
    # "dense": bf16 GEMMs with the unquantized weights, a little closer to the checkpoint (mean KL
    # to the fp32 model 0.0018 vs 0.0032, README), hits at whole prefill chunks of a prompt only.
    # "auto": rows where the CPU has AMX or AVX512-VNNI (as fast as dense there: models/llama.py), else dense.
    prefill: str = "auto"
    # While the engine runs, keep the objects alive at its start (the model's modules, tokenizer
    # vocabularies, every imported library: ~450k objects after loading SmolLM2) out of the garbage
    # collector's full passes (gc.freeze; gc.unfreeze when it stops). Each full pass otherwise walks
    # them all, ~200 ms holding the GIL (benchmarks/gc_pauses.py, README). Only the young generations
    # are collected first (a full pass took 0.2-0.3 s, and tests/engine 2:26 -> 4:03): older garbage
    # is frozen with the rest until the engine stops. Starting engines one after another in a process,
    # that is the previous engine's (~57k objects, 70-150 MB of RSS here), held while the next one runs,
    # never more. Process-wide: when engines overlap, the first to stop unfreezes for all (each still
    # works, just as before).
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        if self.prefill not in ("auto", "rows", "dense"):
            raise ValueError(f"prefill must be 'auto', 'rows' or 'dense', got {self.prefill!r}")
        if self.max_batch_size < 1 or self.output_buffer < 1 or self.block_size < 1 or self.kv_cache_bytes < 1:
            raise ValueError("max_batch_size, output_buffer, block_size and kv_cache_bytes must be >= 1")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")


def draft_lm_for(target: LoadedModel, speculative: SpeculativeConfig | None) -> DraftLM | None:
    """The draft model a speculative config asks for: the target's first layers (self-draft), a
    checkpoint with the target's tokenizer (draft:PATH), or a DraftLM given directly; else None."""
    if speculative is None or not speculative.uses_draft_model:
        return None
    if "self-draft" in speculative.drafters:
        # under tensor parallelism the ranks run the draft too, on their second KV pool
        model = target.model.draft() if isinstance(target.model, TensorParallelModel) else target.model
        return DraftLM(model, min(speculative.self_draft_layers, target.config.n_layers))  # type: ignore[arg-type]
    if speculative.draft_lm is not None:
        return speculative.draft_lm
    assert speculative.draft_model is not None
    draft = load_model(speculative.draft_model, weights=target.model.weights or "int8",
                       kv_dtype=target.config.kv_dtype)         # the target's cache numerics
    if draft.tokenizer.vocab_size != target.tokenizer.vocab_size or \
            draft.tokenizer.eos_token_ids != target.tokenizer.eos_token_ids:
        raise UnsupportedModelError(
            f"draft model {speculative.draft_model!r} has another tokenizer than the target "
            f"({draft.tokenizer.vocab_size} vs {target.tokenizer.vocab_size} ids): a draft must share it")
    return DraftLM.full(draft.model)


def prefill_rows(model: object, prefill: str) -> bool:
    """Whether EngineConfig.prefill puts prompt chunks on the rows path for this model. The engine
    passes it with each batch and leaves the model as it is: engines sharing one model may differ."""
    fused = getattr(model, "fused_rows", None) is not None
    if prefill == "rows" and not fused:
        raise UnsupportedModelError("prefill='rows' needs the native int8 rows path (int8 weights on a CPU where "
                                    "the native kernels build, no tensor parallelism)")
    if not hasattr(model, "rows_prefill"):
        return False
    return {"auto": getattr(model, "rows_prefill_default", False), "rows": True, "dense": False}[prefill]


def lane_threads(threads: int | None) -> int:
    """The model lane's torch threads for EngineConfig.threads (see there)."""
    if threads is not None:
        return threads
    if torch.get_num_threads() > 1:
        log.info("model_lane_threads", threads=1, why="this thread runs torch at more than 1 thread; "
                 "call torch.set_num_threads(1) before loading to give the model lane 2")
        return 1
    return min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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
        self.model = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.max_context = min(config.max_context or loaded.config.max_position, loaded.config.max_position)
        self._ids = itertools.count()
        self._streams: dict[RequestId, OutputStream[Delta]] = {}
        self._runtime: Runtime | None = None
        self._closed = False                # no new requests (closed, or an actor crashed)
        self.rows_prefill: bool | None = None   # at start: prompt chunks on the rows path (EngineConfig.prefill)
        self._shut_down = False             # runtime stopped and timeline closed
        self._failure: EngineError | None = None
        k = config.speculative.step_drafts if config.speculative else 0          # draft rows per request
        per_seq = -(-(self.max_context + k + 1) // config.block_size)
        # Requests are admitted by the blocks they may need, so a smaller pool queues them, never fails them,
        # unless one request alone needs more than the pool (a typed error for that request).
        budget = max(1, config.kv_cache_bytes // block_bytes(loaded.config, config.block_size))
        num_blocks = config.num_kv_blocks or min(per_seq * config.max_batch_size, budget)
        self.grammars = GrammarLayer(loaded.tokenizer, loaded.config.vocab_size, config.grammar)
        self._draft_lm = draft_lm_for(loaded, config.speculative)
        self._sched_config = SchedulerConfig(
            max_batch_size=config.max_batch_size, max_drafts=k, prefill_chunk=config.prefill_chunk,
            max_step_tokens=max(config.max_step_tokens, config.max_batch_size * (k + 1)),
            max_position=self.max_context, block_size=config.block_size, num_blocks=num_blocks)

    @classmethod
    def from_pretrained(cls, name_or_path: str = "smollm2-135m-instruct", *,
                        speculative: SpeculativeConfig | str | None = "ngram+forced", draft_len: int = 3,
                        grammar_backend: BackendName = "auto", max_batch_size: int = 8,
                        weights: Weights = "int8", kv_dtype: Dtype | None = None, tensor_parallel: int = 1,
                        **options: object) -> Engine:
        """Load a model (see models.loader.load_model) and build an engine around it.

        speculative: a SpeculativeConfig, a string such as "ngram+forced" / "ngram" / "forced", or
        None / "none" for one token per step. kv_dtype: what the KV cache stores (None: the
        loader's default, fp16 beside int8 weights on AVX-512 CPUs). tensor_parallel: N > 1 runs the target's
        forward on N worker processes, each holding 1/N of the weights (models/tp_group.py); they
        start with the engine. options: the other EngineConfig fields.
        """
        if isinstance(speculative, str) or speculative is None:
            speculative = SpeculativeConfig.parse(speculative, max_draft_len=draft_len)
        config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=grammar_backend),
                              max_batch_size=max_batch_size, **options)  # type: ignore[arg-type]
        if tensor_parallel > 1:
            return cls(load_tensor_parallel(name_or_path, tensor_parallel, weights=weights, kv_dtype=kv_dtype), config)
        return cls(load_model(name_or_path, weights=weights, kv_dtype=kv_dtype), config)

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        c = self._sched_config
        loaded = self.model
        rows = self.rows_prefill = prefill_rows(loaded.model, self.config.prefill)  # first: it may refuse
        if isinstance(loaded.model, TensorParallelModel):
            await self._start_workers(loaded.model)
        timeline = self._timeline = CpuTimeline(model_threads=lane_threads(self.config.threads))
        tp = isinstance(loaded.model, TensorParallelModel)
        # A prompt's K/V must be bit-identical with and without the cache. On the batch-invariant
        # rows path a token's K/V are the same whichever chunk or step computed them: hits at any
        # block, outputs included. The dense path rounds by chunk: hits at whole chunks, and only
        # what prefill chunks computed is shared (models/kv_cache.py).
        kv = self._kv = PagedKVCache(loaded.config, num_blocks=c.num_blocks, block_size=c.block_size,
                                      prefix_caching=self.config.prefix_caching and not tp,
                                      prefix_granularity=c.block_size if rows else math.lcm(c.prefill_chunk, c.block_size),
                                      share_outputs=rows)
        if tp:
            kv.k = kv.v = torch.empty(0)    # the ranks hold the K/V; here only the block tables matter
        buffers = MaskBuffers.allocate(c.max_batch_size, c.max_drafts, loaded.config.vocab_size)
        step = StepBuffers.allocate(c.max_batch_size)
        eos = self.tokenizer.eos_token_ids
        # Every actor is built with what it talks to: parts of a step meet only in the lanes and
        # the step buffers; the Scheduler alone sends to the others.
        kv_actor = KVActor(kv)
        verifier = VerifierActor(loaded.model, kv, timeline, buffers, step, self.tokenizer.vocab_size, eos,
                                 rows_prefill=rows)
        draft_lm = self._draft_lm
        if draft_lm is not None and draft_lm.model is loaded.model:
            draft_lm = replace(draft_lm, all_rows=rows)     # the target's own layers: its prompt path too
        drafter = self._drafter = (ModelDrafter(draft_lm, c.num_blocks, c.block_size, eos, c.prefill_chunk)
                                   if draft_lm is not None else None)
        if drafter is not None and isinstance(drafter.lm.model, TensorParallelModel):
            drafter.kv.k = drafter.kv.v = torch.empty(0)        # a self-draft's K/V live on the ranks too
        draft = DraftActor(self.config.speculative, self.tokenizer.vocab_size, timeline, step, model=drafter,
                           bitmask=buffers.bitmask, free_rows=buffers.free)
        grammar = GrammarActor(self.grammars.router, timeline, buffers, step)  # type: ignore[arg-type]
        # A draft model drafts at most K tokens after a request's forced ones: K rounds a step.
        rounds = self.config.speculative.max_draft_len if self.config.speculative else 0
        program = self._program = StepProgram(timeline, step, grammar, draft, verifier, max_draft_len=rounds,
                                              draft_model=drafter is not None, capture=self.config.capture_steps)
        scheduler = Scheduler(c, self.tokenizer, kv_actor, grammar, draft, verifier, program, self._forget)
        self._actors = (kv_actor, verifier, grammar, draft, scheduler)
        self._scheduler = scheduler
        self._runtime = Runtime(list(self._actors), on_failure=self._on_failure)
        await self._runtime.__aenter__()
        if self.config.freeze_gc:
            gc.collect(1)
            gc.freeze()
        return self

    async def _start_workers(self, model: TensorParallelModel) -> None:
        """Spawn the tensor-parallel ranks, sized for this engine's KV pool(s) and step (seconds, in a thread)."""
        c = self._sched_config
        lm = self._draft_lm
        draft = (c.num_blocks, lm.n_layers) if lm is not None and isinstance(lm.model, TensorParallelModel) else None
        rows = 2 * c.max_batch_size * (c.max_drafts + 1)         # x2: classifier-free guidance's second row set
        config = TPConfig(world=model.world, num_blocks=c.num_blocks, block_size=c.block_size, max_rows=rows,
                          step_timeout_s=self.config.tp_step_timeout_s, draft_cache=draft)
        try:
            await anyio.to_thread.run_sync(model.start, config)
        except BaseException:
            await anyio.to_thread.run_sync(model.close)
            raise

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
        if self._runtime is None:
            await self._stop_workers()
            return                      # never entered
        try:
            await self._runtime.__aexit__(None, None, None)
        except EngineError:
            pass                        # already reported to every request
        finally:
            if self.config.freeze_gc:
                gc.unfreeze()
            await self._stop_workers()
            self._timeline.close()
            self._program.close()
            self._kv.release()
            if self._drafter is not None:
                self._drafter.kv.release()

    async def _stop_workers(self) -> None:
        if isinstance(self.model.model, TensorParallelModel):
            await anyio.to_thread.run_sync(self.model.model.close)

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
        if self._closed or self._runtime is None:
            raise self._failure or EngineClosedError("the engine is not running (use `async with engine:`)")
        if not isinstance(sampling, SamplingParams):
            raise InvalidParameterError("sampling", f"must be a SamplingParams, got {type(sampling).__name__}")
        if sampling.ignore_eos and grammar is not None:
            # Once the grammar completes, the stop token is the only one it allows: there is no going on.
            raise InvalidParameterError("ignore_eos", "cannot be combined with a grammar (a complete document "
                                                      "ends the request); use max_tokens or drop ignore_eos")
        if grammar_backend is not None:
            self.grammars.check_name(grammar_backend)
        tokens = self._encode(prompt)
        uncond = None
        if sampling.guidance_scale is not None:
            uncond = self._encode(negative_prompt if negative_prompt is not None else [{"role": "user", "content": ""}])
        elif negative_prompt is not None:
            raise RequestError("negative_prompt needs classifier-free guidance: set sampling.guidance_scale")
        rid = f"req-{next(self._ids)}"
        stream: OutputStream[Delta] = OutputStream(self.config.output_buffer, on_room=self._wake,
                                                   on_cancel=lambda: self._cancel(rid))
        self._streams[rid] = stream
        spec = RequestSpec(rid, tuple(tokens), grammar, sampling, tuple(uncond) if uncond is not None else None)
        submitted = False
        try:
            await self._scheduler.send(Submit(spec, stream))
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

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0 and \
                all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            return self._check_length(self._token_ids(prompt))      # type: ignore[arg-type]
        if not isinstance(prompt, str) and not (isinstance(prompt, Sequence) and
                                                all(isinstance(m, Mapping) for m in prompt)):
            raise InvalidParameterError("prompt", f"must be a str, a list of chat messages (dicts) or a list of "
                                                  f"token ids (ints), got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise EmptyPromptError("the prompt is empty (an empty string or message list): give at least one token")
        try:
            tokens = self.tokenizer.encode_prompt(prompt)  # type: ignore[arg-type]
        except InterlockError:
            raise
        except Exception as exc:        # jinja2 / transformers errors: how a chat template refuses bad messages
            raise InvalidParameterError("prompt", f"the chat template refused the messages: {exc}") from exc
        return self._check_length(tokens)

    def _token_ids(self, ids: Sequence[int]) -> list[int]:
        """A prompt given as token ids: each must be a tokenizer id (the model's padding ids are not)."""
        vocab = self.tokenizer.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= t < vocab:
                raise InvalidParameterError("prompt", f"token id {int(t)} at position {i} is outside the "
                                                      f"vocabulary [0, {vocab})")
        return [int(t) for t in ids]

    def _check_length(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise EmptyPromptError("the prompt encodes to no tokens: give at least one token")
        check_prompt_fits(self.model.config, len(tokens))
        if len(tokens) + 1 > self.max_context:
            raise PromptTooLongError(f"prompt has {len(tokens)} tokens; the engine's context is {self.max_context} "
                                     "(prompt + at least 1 generated token must fit): shorten the prompt")
        return tokens

    async def _compile(self, rid: RequestId, spec: GrammarSpec, backend: BackendName | None) -> None:
        """Compile in this request's own task (a worker thread underneath), while its prompt prefills."""
        start = time.perf_counter()
        try:
            compiled = await self.grammars.compile(spec, backend)
        except GrammarError as exc:
            await self._scheduler.send(GrammarReady(rid, error=exc))
            return
        await self._scheduler.send(GrammarReady(rid, compiled, compile_ms=(time.perf_counter() - start) * 1e3))

    def _wake(self) -> None:
        self._post(Wake())

    def _cancel(self, rid: RequestId) -> None:
        self._post(Cancel(rid))

    def _post(self, msg: object) -> None:
        """From the consumer's side; a full inbox is fine: the scheduler re-checks streams every step."""
        if self._closed:
            return
        try:
            self._scheduler.send_nowait(msg)
        except (ChannelFullError, ChannelClosedError):
            pass

    # --- introspection (tests, metrics) ------------------------------------------------------

    async def metrics(self) -> EngineMetrics:
        """Step counts and times since start (exposed grammar time included)."""
        return await self._scheduler.ask(lambda r: GetMetrics(r))

    async def resources(self) -> dict[str, int]:
        """Every per-request thing any actor holds right now (each returns to 0 / to its total when
        the engine is idle): KV blocks and sequences, slots, matchers, n-gram entries, suffix tries,
        adaptive budgets, user-drafter contexts, draft-model sequences and blocks, seeded generators
        (target and draft), penalty counts, compiled grammars kept for unadmitted requests, output
        streams, requests. Kept across requests, bounded: the prefix cache's blocks (kv_cached_blocks;
        they count as free, since eviction reclaims them) and the global suffix trie (suffix_global_*).
        The KV pool's invariants (refcounts = block-table references) are checked on every call."""
        kv_actor, verifier, grammar, draft, scheduler = self._actors
        free, total, seqs, cached = await kv_actor.ask(lambda r: KVUsage(r))
        generators, penalties = await verifier.ask(lambda r: Count(r))
        res = {"kv_free_blocks": free, "kv_total_blocks": total, "kv_sequences": seqs, "kv_cached_blocks": cached,
               "matchers": await grammar.ask(lambda r: Count(r)),
               "verify_generators": generators, "penalty_entries": penalties}
        res.update(await draft.ask(lambda r: Count(r)))
        res.update(await scheduler.ask(lambda r: Count(r)))
        res["engine_streams"] = len(self._streams)
        return res
