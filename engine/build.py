"""Building a runtime for a device, in one place: `build_runtime(loaded, config, ...)` picks the
timeline, the KV cache's device and the step buffers for the target's forward (made by
engine/load.py), then wires the five actors. Everything device-specific an engine has is decided
here and there; the actors, the step program and every law are the same on each.

    host runner (CPU)         CpuTimeline, the int8 Transformer, host KV, VerifierActor
    device runner on the CPU  CpuTimeline, DeviceLlama in float32 with torch reference ops, host KV,
                              DeviceVerifier (fixed-shape steps, captured per bucket): what CI
                              tests the CUDA path with
    device runner on CUDA     CudaTimeline (grammar host functions on their own stream, steps
                              captured as CUDA graphs), DeviceLlama in bf16 with Triton ops, KV on
                              the GPU, pinned mask buffers, DeviceVerifier
"""
from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import torch

from interlock.actors.device.draft_actor import DeviceDraftActor
from interlock.actors.device.verifier import DeviceVerifier
from interlock.actors.draft_actor import DraftActor
from interlock.actors.grammar_actor import GrammarActor, MaskBuffers
from interlock.actors.kv_actor import KVActor
from interlock.actors.step.planner import guided_rows, sequence_blocks
from interlock.actors.framework.runtime import Runtime as ActorRuntime
from interlock.actors.scheduler import Scheduler, SchedulerConfig
from interlock.actors.step.program import StepState, StepProgram
from interlock.actors.verifier_actor import VerifierActor
from interlock.drafters.device_draft import DeviceDraftLM, DeviceDrafter
from interlock.drafters.model import DraftLM, ModelDrafter
from interlock.engine.config import EngineConfig, Runner
from interlock.grammars.backends import BackendRouter
from interlock.logs import get_logger
from interlock.models.device_llama import DeviceLlama
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache, block_bytes
from interlock.models.loader import LoadedModel
from interlock.parallel.group import TensorParallelModel, TPConfig
from interlock.protocol.errors import EngineError, UnsupportedModelError
from interlock.protocol.messages import Count, KVUsage
from interlock.protocol.types import RequestId
from interlock.streams.cpu_timeline import CpuTimeline
from interlock.streams.cuda_rules import CudaRulesTimeline

log = get_logger(__name__)


def lane_threads(threads: int | None) -> int:
    """The model lane's torch threads for EngineConfig.threads (see there)."""
    if threads is not None:
        return threads
    if torch.get_num_threads() > 1:
        log.info("model_lane_threads", threads=1, why="this thread runs torch at more than 1 thread; "
                 "call torch.set_num_threads(1) before loading to give the model lane 2")
        return 1
    return min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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


def scheduler_config(config: EngineConfig, model: ModelConfig, max_context: int) -> SchedulerConfig:
    """The Scheduler's limits for this engine: draft rows per request, step budget, KV pool size."""
    k = config.speculative.step_drafts if config.speculative else 0          # draft rows per request
    per_seq = sequence_blocks(max_context, k, config.block_size)
    # Requests are admitted by the blocks they may need, so a smaller pool queues them, never fails them,
    # unless one request alone needs more than the pool (a typed error for that request).
    budget = max(1, config.kv_cache_bytes // block_bytes(model, config.block_size))
    num_blocks = config.num_kv_blocks or min(per_seq * config.max_batch_size, budget)
    return SchedulerConfig(max_batch_size=config.max_batch_size, max_drafts=k, prefill_chunk=config.prefill_chunk,
                           max_step_tokens=config.max_step_tokens,
                           max_position=max_context, block_size=config.block_size, num_blocks=num_blocks)


def start_workers(loaded: LoadedModel, sched: SchedulerConfig, draft_lm: DraftLM | DeviceDraftLM | None,
                  config: EngineConfig) -> None:
    """Tensor parallelism: spawn the ranks, sized for this engine's KV pool(s) and step (seconds;
    call it in a worker thread). Nothing to do for a model in this process."""
    model = loaded.model
    if isinstance(model, DeviceLlama) and model.tp is not None and model.tp.leader is not None:
        model.tp.leader.start()         # the device runner's ranks (parallel/device_group.py)
        return
    if not isinstance(model, TensorParallelModel):
        return
    draft = (sched.num_blocks, draft_lm.n_layers) if draft_lm is not None and \
        isinstance(draft_lm.model, TensorParallelModel) else None
    rows = guided_rows(sched.max_batch_size, sched.max_drafts)
    tp = TPConfig(world=model.world, num_blocks=sched.num_blocks, block_size=sched.block_size, max_rows=rows,
                  step_timeout_s=config.tp_step_timeout_s, draft_cache=draft)
    try:
        model.start(tp)
    except BaseException:
        model.close()
        raise


def stop_workers(loaded: LoadedModel) -> None:
    """Tensor parallelism: stop the ranks (idempotent; nothing for a model in this process)."""
    model = loaded.model
    if isinstance(model, TensorParallelModel):
        model.close()
    elif isinstance(model, DeviceLlama) and model.tp is not None and model.tp.leader is not None:
        model.tp.leader.close()


@dataclass
class Runtime:
    """What build_runtime made: the actors in start order, and what stopping must free."""

    actors: tuple[Any, ...]           # kv, verifier, grammar, draft, scheduler
    scheduler: Scheduler
    timeline: Any
    program: StepProgram
    kv: PagedKVCache
    drafter: ModelDrafter | DeviceDrafter | None
    rows_prefill: bool
    supervisor: ActorRuntime | None = None      # the actors' one task group, once started

    async def start(self, loaded: LoadedModel, sched: SchedulerConfig, draft_lm: DraftLM | DeviceDraftLM | None,
                    config: EngineConfig, on_failure: Callable[[str, BaseException], None]) -> None:
        """Start the tensor-parallel ranks (if any), then every actor in one task group."""
        try:
            await anyio.to_thread.run_sync(start_workers, loaded, sched, draft_lm, config)
        except BaseException:
            self.close()
            raise
        self.supervisor = ActorRuntime(list(self.actors), on_failure=on_failure)
        await self.supervisor.__aenter__()
        if config.freeze_gc:        # EngineConfig.freeze_gc says why
            gc.collect(1)
            gc.freeze()

    async def stop(self, loaded: LoadedModel, config: EngineConfig) -> None:
        """Stop the actors (a crash was already reported to every request), the ranks, and free."""
        assert self.supervisor is not None, "stop() follows start()"
        try:
            await self.supervisor.__aexit__(None, None, None)
        except EngineError:
            pass
        finally:
            if config.freeze_gc:
                gc.unfreeze()
            await anyio.to_thread.run_sync(stop_workers, loaded)
            self.close()

    def close(self) -> None:
        try:
            self.timeline.close()
        except Exception as exc:  # noqa: BLE001 - after a fault or a hang it may not close; free the rest
            log.error("timeline_close_failed", error=repr(exc))
        try:
            self.program.close()        # drops its programs unfreed after a fault (StepProgram.close)
        except Exception as exc:  # noqa: BLE001 - a shutdown frees what it can and says what it could not
            log.error("programs_close_failed", error=repr(exc))
        self.kv.release()
        if self.drafter is not None:
            self.drafter.kv.release()

    async def resources(self) -> dict[str, int]:
        """What every actor holds now (Engine.resources says what each count is)."""
        kv_actor, verifier, grammar, draft, scheduler = self.actors
        free, total, seqs, cached = await kv_actor.ask(lambda r: KVUsage(r))
        generators, penalties, walks = await verifier.ask(lambda r: Count(r))
        res = {"kv_free_blocks": free, "kv_total_blocks": total, "kv_sequences": seqs, "kv_cached_blocks": cached,
               "matchers": await grammar.ask(lambda r: Count(r)),
               "verify_generators": generators, "penalty_entries": penalties, "conditional_walks": walks}
        res.update(await draft.ask(lambda r: Count(r)))
        res.update(await scheduler.ask(lambda r: Count(r)))
        return res


def failure_of(actor: str, exc: BaseException) -> EngineError:
    """The error an actor's crash gives every request: the innermost EngineError in its chain of
    causes (a lane wraps what its function raised, a TimelineError around a WorkerError, and the
    innermost says what failed), else an EngineError naming the actor."""
    found, seen = None, 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, EngineError):
            found = cause
        # as a traceback reads a chain: `raise ... from None` ends it
        cause, seen = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__), seen + 1
    if found is not None:
        return found
    failure = EngineError(f"the engine failed: actor {actor} crashed: {exc!r}")
    failure.__cause__ = exc
    return failure


def build_runtime(loaded: LoadedModel, config: EngineConfig, runner: Runner, sched: SchedulerConfig,
                  router: BackendRouter, draft_lm: DraftLM | DeviceDraftLM | None,
                  forget: Callable[[RequestId], None]) -> Runtime:
    """Every part of a running engine for `runner` (module docstring); nothing is started yet."""
    model = loaded.model
    # for_runner (engine/load.py) placed the device runner's forward on its device
    device = model.device if isinstance(model, DeviceLlama) else torch.device("cpu")
    tp = isinstance(model, TensorParallelModel)
    rows = prefill_rows(model, config.prefill) if runner == "host" else False     # first: it may refuse
    timeline = _timeline(device, config, runner)
    # A prompt's K/V must be bit-identical with and without the cache. On a batch-invariant path
    # (the rows path, or the device forward) a token's K/V are the same whichever chunk or step
    # computed them: hits at any block, outputs included. The dense path rounds by chunk: hits at
    # whole chunks, and only what prefill chunks computed is shared (models/kv_cache.py).
    invariant = rows or runner == "device"
    kv = PagedKVCache(loaded.config, num_blocks=sched.num_blocks, block_size=sched.block_size, device=device,
                      prefix_caching=config.prefix_caching and not tp,
                      prefix_granularity=sched.block_size if invariant else math.lcm(sched.prefill_chunk,
                                                                                     sched.block_size),
                      share_outputs=invariant, spare_blocks=1 if runner == "device" else 0)
    if tp:
        kv.k = kv.v = torch.empty(0)    # the ranks hold the K/V; here only the block tables matter
    buffers = MaskBuffers.allocate(sched.max_batch_size, sched.max_drafts, loaded.config.vocab_size)
    if device.type == "cuda":           # the model lane copies them asynchronously (and inside graphs)
        buffers = MaskBuffers(buffers.bitmask.pin_memory(), buffers.rows.pin_memory(), buffers.rows_per_slot,
                              buffers.free.pin_memory())
    step = StepState.allocate(sched.max_batch_size)
    eos = loaded.tokenizer.eos_token_ids
    vocab = loaded.tokenizer.vocab_size
    # Every actor is built with what it talks to: parts of a step meet only in the lanes and
    # the step buffers; the Scheduler alone calls the others (actors/scheduler.py).
    kv_actor = KVActor(kv)
    # A draft model drafts at most K tokens after a request's forced ones: K rounds a step.
    rounds = config.speculative.max_draft_len if config.speculative else 0
    drafter: ModelDrafter | DeviceDrafter | None = None
    draft: DraftActor
    if isinstance(model, DeviceLlama):     # the device runner's forward (for_runner made it)
        if isinstance(draft_lm, DeviceDraftLM):
            assert config.speculative is not None
            drafter = DeviceDrafter(draft_lm, slots=sched.max_batch_size, lanes=sched.max_batch_size,
                                    draft_rows=sched.max_drafts, rounds=rounds, num_blocks=sched.num_blocks,
                                    block_size=sched.block_size, max_blocks=sched.max_blocks, vocab=vocab,
                                    mask_words=buffers.bitmask.shape[1], eos=eos, prefill_chunk=sched.prefill_chunk)
            draft = DeviceDraftActor(config.speculative, vocab, timeline, step, drafter, buffers)
        else:
            draft = DraftActor(config.speculative, vocab, timeline, step)
        verifier: VerifierActor = DeviceVerifier(
            model, kv, timeline, buffers, step, vocab, eos,
            # a step's rows: decode rows within max_step_tokens, and a first prompt chunk (with its CFG
            # companion's) may exceed it; guided decode rows count twice
            max_rows=max(sched.step_budget, 2 * sched.prefill_chunk)
            + guided_rows(sched.max_batch_size, sched.max_drafts),
            max_drafts=sched.max_drafts, buckets=config.buckets(), max_blocks=sched.max_blocks,
            pad_block=sched.num_blocks,
            drafter=drafter if isinstance(drafter, DeviceDrafter) else None)
    else:
        verifier = VerifierActor(model, kv, timeline, buffers, step, vocab, eos, rows_prefill=rows)
        if isinstance(draft_lm, DraftLM) and draft_lm.model is model:
            draft_lm = replace(draft_lm, all_rows=rows)     # the target's own layers: its prompt path too
        if isinstance(draft_lm, DraftLM):
            drafter = ModelDrafter(draft_lm, sched.num_blocks, sched.block_size, eos, sched.prefill_chunk)
            if isinstance(drafter.lm.model, TensorParallelModel):
                drafter.kv.k = drafter.kv.v = torch.empty(0)        # a self-draft's K/V live on the ranks too
        draft = DraftActor(config.speculative, vocab, timeline, step,
                           model=drafter if isinstance(drafter, ModelDrafter) else None, bitmask=buffers.bitmask,
                           free_rows=buffers.free)
    grammar = GrammarActor(router, timeline, buffers, step, mask_threads=config.grammar.mask_threads,
                           batched_masks=runner == "device" if config.grammar.batched_masks is None
                           else config.grammar.batched_masks, forced_drafts=draft.chain.use_forced)
    program = StepProgram(timeline, step, grammar, draft, verifier, max_draft_len=rounds,
                          draft_model=isinstance(drafter, ModelDrafter), capture=config.capture_steps,
                          step_timeout_s=config.step_timeout_s, watchdog_poll_s=config.watchdog_poll_s,
                          peers=model.tp.leader if isinstance(model, DeviceLlama) and model.tp else None)
    scheduler = Scheduler(sched, loaded.tokenizer, kv_actor, grammar, draft, verifier, program, forget)
    return Runtime((kv_actor, verifier, grammar, draft, scheduler), scheduler, timeline, program, kv, drafter, rows)


def _timeline(device: torch.device, config: EngineConfig, runner: Runner) -> Any:
    trace = config.trace_host_functions
    if device.type == "cuda":
        from interlock.streams.cuda_timeline import CudaTimeline

        return CudaTimeline(device, trace=trace)
    if runner == "device":      # the device runner's path on the CPU: under CUDA's rules (streams/cuda_rules.py)
        return CudaRulesTimeline(model_threads=lane_threads(config.threads), trace=trace)
    return CpuTimeline(model_threads=lane_threads(config.threads))
