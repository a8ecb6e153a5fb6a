"""Building a runtime for a device, in one place: `build_runtime(loaded, config, ...)` picks the
timeline, the target's forward, the KV cache's device and the step buffers, then wires the five
actors. Everything device-specific an engine has is decided here; the actors, the step program and
every law are the same on each.

    host runner (CPU)         CpuTimeline, the int8 Transformer, host KV, VerifierActor
    device runner on the CPU  CpuTimeline, DeviceLlama in float32 with torch reference ops, host KV,
                              DeviceVerifier (fixed-shape steps, captured per bucket): what CI
                              tests the CUDA path with
    device runner on CUDA     CudaTimeline (grammar host functions on their own stream, steps
                              captured as CUDA graphs), DeviceLlama in bf16 with Triton ops, KV on
                              the GPU, pinned mask buffers, DeviceVerifier
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from interlock.actors.device_verifier import DeviceVerifier
from interlock.actors.draft_actor import DraftActor
from interlock.actors.grammar_actor import GrammarActor, MaskBuffers
from interlock.actors.kv_actor import KVActor
from interlock.actors.scheduler import Scheduler, SchedulerConfig
from interlock.actors.step import StepState, StepProgram
from interlock.actors.verifier_actor import VerifierActor
from interlock.drafters.model import DraftLM, ModelDrafter
from interlock.engine.config import EngineConfig, Runner
from interlock.logs import get_logger
from interlock.models.device_llama import DeviceLlama
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache, block_bytes
from interlock.models.loader import LoadedModel, load_model
from interlock.parallel.group import TensorParallelModel, TPConfig
from interlock.protocol.errors import UnsupportedModelError
from interlock.protocol.speculative import SpeculativeConfig
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


def for_runner(loaded: LoadedModel, config: EngineConfig) -> tuple[LoadedModel, Runner]:
    """The model as the runner computes it: unchanged for the host runner; the device forward
    (bf16 on CUDA, float32 on the CPU) for the device runner, which needs float weights."""
    device = config.torch_device()
    runner = config.runner_for(device)
    model = loaded.model
    if runner == "host":
        if isinstance(model, DeviceLlama):
            raise UnsupportedModelError("this model was loaded for the device runner; use runner='device'")
        return loaded, runner
    if isinstance(model, TensorParallelModel):
        raise UnsupportedModelError("tensor parallelism is not on CUDA yet: use one GPU, or the CPU engine")
    if config.speculative is not None and config.speculative.uses_draft_model:
        raise UnsupportedModelError("draft models (self-draft, draft:PATH) are not on CUDA yet: use ngram, suffix, "
                                    "forced or user drafters there")
    if isinstance(model, DeviceLlama):
        if model.device != device and not (device.type == model.device.type == "cuda" and device.index is None):
            raise UnsupportedModelError(f"the model is on {model.device}, the engine asks for {device}")
        return loaded, runner
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = DeviceLlama.from_transformer(model, device, dtype)
    return replace(loaded, model=target, config=target.config), runner  # type: ignore[arg-type]


def scheduler_config(config: EngineConfig, model: ModelConfig, max_context: int) -> SchedulerConfig:
    """The Scheduler's limits for this engine: draft rows per request, step budget, KV pool size."""
    k = config.speculative.step_drafts if config.speculative else 0          # draft rows per request
    per_seq = -(-(max_context + k + 1) // config.block_size)
    # Requests are admitted by the blocks they may need, so a smaller pool queues them, never fails them,
    # unless one request alone needs more than the pool (a typed error for that request).
    budget = max(1, config.kv_cache_bytes // block_bytes(model, config.block_size))
    num_blocks = config.num_kv_blocks or min(per_seq * config.max_batch_size, budget)
    return SchedulerConfig(max_batch_size=config.max_batch_size, max_drafts=k, prefill_chunk=config.prefill_chunk,
                           max_step_tokens=max(config.max_step_tokens, config.max_batch_size * (k + 1)),
                           max_position=max_context, block_size=config.block_size, num_blocks=num_blocks)


def start_workers(loaded: LoadedModel, sched: SchedulerConfig, draft_lm: DraftLM | None, config: EngineConfig) -> None:
    """Tensor parallelism: spawn the ranks, sized for this engine's KV pool(s) and step (seconds;
    call it in a worker thread). Nothing to do for a model in this process."""
    model = loaded.model
    if not isinstance(model, TensorParallelModel):
        return
    draft = (sched.num_blocks, draft_lm.n_layers) if draft_lm is not None and \
        isinstance(draft_lm.model, TensorParallelModel) else None
    rows = 2 * sched.max_batch_size * (sched.max_drafts + 1)       # x2: classifier-free guidance's second row set
    tp = TPConfig(world=model.world, num_blocks=sched.num_blocks, block_size=sched.block_size, max_rows=rows,
                  step_timeout_s=config.tp_step_timeout_s, draft_cache=draft)
    try:
        model.start(tp)
    except BaseException:
        model.close()
        raise


def stop_workers(loaded: LoadedModel) -> None:
    """Tensor parallelism: stop the ranks (idempotent; nothing for a model in this process)."""
    if isinstance(loaded.model, TensorParallelModel):
        loaded.model.close()


@dataclass
class Runtime:
    """What build_runtime made: the actors in start order, and what stopping must free."""

    actors: tuple[Any, ...]           # kv, verifier, grammar, draft, scheduler
    scheduler: Scheduler
    timeline: Any
    program: StepProgram
    kv: PagedKVCache
    drafter: ModelDrafter | None
    rows_prefill: bool

    def close(self) -> None:
        try:
            self.timeline.close()
        except Exception as exc:  # noqa: BLE001 - after a fault or a hang it may not close; free the rest
            log.error("timeline_close_failed", error=repr(exc))
        self.program.close()
        self.kv.release()
        if self.drafter is not None:
            self.drafter.kv.release()


def build_runtime(loaded: LoadedModel, config: EngineConfig, runner: Runner, sched: SchedulerConfig,
                  router: object, draft_lm: DraftLM | None, forget: Any) -> Runtime:
    """Every part of a running engine for `runner` (module docstring); nothing is started yet."""
    model = loaded.model
    device = model.device if runner == "device" else torch.device("cpu")     # for_runner placed the model
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
    # the step buffers; the Scheduler alone sends to the others.
    kv_actor = KVActor(kv)
    if runner == "device":
        per_seq = -(-(sched.max_position + sched.max_drafts + 1) // sched.block_size)
        verifier: VerifierActor = DeviceVerifier(
            model, kv, timeline, buffers, step, vocab, eos,  # type: ignore[arg-type]
            # a step's rows: decode rows within max_step_tokens, and a first prompt chunk (with its CFG
            # companion's) may exceed it; guided decode rows count twice
            max_rows=max(sched.max_step_tokens, 2 * sched.prefill_chunk)
            + 2 * sched.max_batch_size * (sched.max_drafts + 1),
            max_drafts=sched.max_drafts, buckets=config.buckets(), max_blocks=per_seq, pad_block=sched.num_blocks)
    else:
        verifier = VerifierActor(model, kv, timeline, buffers, step, vocab, eos, rows_prefill=rows)
    if draft_lm is not None and draft_lm.model is model:
        draft_lm = replace(draft_lm, all_rows=rows)     # the target's own layers: its prompt path too
    drafter = (ModelDrafter(draft_lm, sched.num_blocks, sched.block_size, eos, sched.prefill_chunk)
               if draft_lm is not None else None)
    if drafter is not None and isinstance(drafter.lm.model, TensorParallelModel):
        drafter.kv.k = drafter.kv.v = torch.empty(0)        # a self-draft's K/V live on the ranks too
    draft = DraftActor(config.speculative, vocab, timeline, step, model=drafter, bitmask=buffers.bitmask,
                       free_rows=buffers.free)
    grammar = GrammarActor(router, timeline, buffers, step, mask_threads=config.grammar.mask_threads,  # type: ignore[arg-type]
                           batched_masks=runner == "device" if config.grammar.batched_masks is None
                           else config.grammar.batched_masks)
    # A draft model drafts at most K tokens after a request's forced ones: K rounds a step.
    rounds = config.speculative.max_draft_len if config.speculative else 0
    program = StepProgram(timeline, step, grammar, draft, verifier, max_draft_len=rounds,
                          draft_model=drafter is not None, capture=config.capture_steps,
                          step_timeout_s=config.step_timeout_s, watchdog_poll_s=config.watchdog_poll_s)
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
