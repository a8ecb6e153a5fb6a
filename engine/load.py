"""The models an engine runs, in one place: the target as its config asks for it (loaded, or the
device forward made from a loaded one), the draft model its speculation asks for, and the checks
that need only the model's config, made before any weight is read.

    Engine.from_pretrained  ->  check_before_loading, load_target  ->  Engine(loaded, config)
    Engine(loaded, config)  ->  for_runner (the device forward), draft_lm_for (the draft model)
"""
from __future__ import annotations

import time
from dataclasses import replace
import torch

from interlock.drafters.device_draft import DeviceDraftLM, device_draft_lm
from interlock.drafters.model import DraftLM
from interlock.engine.config import EngineConfig, Runner
from interlock.logs import get_logger
from interlock.models.device_llama import DeviceLlama
from interlock.models.linear import Weights, WeightsChoice
from interlock.models.llama import Transformer
from interlock.models.loader import LoadedModel, load_model, model_config
from interlock.parallel.group import TensorParallelModel, load_tensor_parallel
from interlock.parallel.sharded import Shard
from interlock.protocol.errors import UnsupportedModelError
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import Dtype

log = get_logger(__name__)


# docs/scaling.md says what has run: tensor parallelism on the device runner on the CPU (gloo), not NCCL.
CUDA_TP = ("tensor parallelism is not on CUDA yet (it has run on the device runner on the CPU only, "
           "docs/scaling.md): use one GPU, or device='cpu'")


def load_device_shard(name_or_path: str, world: int, *, seed: int = 0, threads: int = 1,
                      step_timeout_s: float = 60.0) -> LoadedModel:
    """Rank 0's shard of the device forward (float32 on the CPU), with the group of the other W-1
    ranks not started yet (engine/build.py starts it with the engine): parallel/device_group.py."""
    from interlock.models.loader import load_tokenizer
    from interlock.parallel.device_group import DeviceGroup
    from interlock.parallel.shard_sources import open_source
    from interlock.parallel.sharded import load_shard

    config, source, inv_freq = open_source(name_or_path, "float32", seed)
    tokenizer = load_tokenizer(name_or_path)
    if config.eos_token_id is None and tokenizer.eos_token_ids:
        config = config.replace(eos_token_id=tokenizer.eos_token_ids[0])
    shard = load_shard(source, config, Shard(0, world), inv_freq, "float")
    group = DeviceGroup(name_or_path, world, config, seed=seed, threads=threads, step_timeout_s=step_timeout_s)
    model = DeviceLlama.from_transformer(shard, "cpu", torch.float32, tp=group.comm)
    return LoadedModel(name_or_path, model.config, model, tokenizer, 0.0)


def check_before_loading(name_or_path: str, tensor_parallel: int) -> None:
    """What the model's config alone decides, before seconds of loading: a tensor-parallel size
    that does not divide its heads, KV heads and MLP width (UnsupportedModelError)."""
    if tensor_parallel > 1:
        Shard(0, tensor_parallel).check(model_config(name_or_path))


def load_target(name_or_path: str, config: EngineConfig, *, weights: WeightsChoice = "auto",
                kv_dtype: Dtype | None = None, tensor_parallel: int = 1) -> LoadedModel:
    """The target as `config`'s runner computes it: float weights in the forward's dtype for the
    device runner (for_runner moves them), the ranks' metadata under tensor parallelism, else
    load_model's. Logs `model_loaded` at info."""
    start = time.perf_counter()
    check_before_loading(name_or_path, tensor_parallel)
    target = config.torch_device()
    device_runner = config.runner_for(target) == "device"
    if device_runner and tensor_parallel > 1:
        if target.type == "cuda":
            raise UnsupportedModelError(CUDA_TP)
        loaded = load_device_shard(name_or_path, tensor_parallel, threads=config.threads or 1,
                                   step_timeout_s=config.tp_step_timeout_s)
    elif device_runner:
        dtype: Dtype = "bfloat16" if target.type == "cuda" else "float32"
        loaded = load_model(name_or_path, weights="float", dtype=dtype)
    elif tensor_parallel > 1:     # the ranks shard float slices: "auto" is int8 there (docs/scaling.md)
        loaded = load_tensor_parallel(name_or_path, tensor_parallel, weights="int8" if weights == "auto" else weights,
                                      kv_dtype=kv_dtype)
    else:
        loaded = load_model(name_or_path, weights=weights, kv_dtype=kv_dtype)
    log.info("model_loaded", source=name_or_path, weights=getattr(loaded.model, "weights", None) or "float",
             dtype=loaded.config.dtype, kv_dtype=loaded.config.kv_dtype, device=str(target),
             tensor_parallel=tensor_parallel, seconds=round(time.perf_counter() - start, 2))
    return loaded


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
    if isinstance(model, TensorParallelModel) or (device.type == "cuda" and getattr(model, "tp", None)):
        raise UnsupportedModelError(CUDA_TP if device.type == "cuda" else
                                    "this model's ranks were started for the host runner: for the device "
                                    "runner load it with the device runner's config (Engine.from_pretrained"
                                    "(..., runner='device', tensor_parallel=N))")
    if isinstance(model, DeviceLlama):
        if model.device != device and not (device.type == model.device.type == "cuda" and device.index is None):
            raise UnsupportedModelError(f"the model is on {model.device}, the engine asks for {device}")
        return loaded, runner
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = DeviceLlama.from_transformer(model, device, dtype)
    return replace(loaded, model=target, config=target.config), runner


def draft_lm_for(target: LoadedModel, speculative: SpeculativeConfig | None) -> DraftLM | DeviceDraftLM | None:
    """The draft model a speculative config asks for: the target's first layers (self-draft), a
    checkpoint with the target's tokenizer (draft:PATH), or a DraftLM given directly; else None.
    For the device runner's forward (a DeviceLlama) it is a DeviceDraftLM on the target's device."""
    if speculative is None or not speculative.uses_draft_model:
        return None
    model = target.model
    if isinstance(model, DeviceLlama):
        return _device_draft_lm(target, speculative)
    if "self-draft" in speculative.drafters:
        # under tensor parallelism the ranks run the draft too, on their second KV pool
        layers = min(speculative.self_draft_layers, target.config.n_layers)
        return DraftLM(model.draft() if isinstance(model, TensorParallelModel) else model, layers)
    if speculative.draft_lm is not None:
        return speculative.draft_lm
    assert speculative.draft_model is not None       # uses_draft_model: one of the three
    weights: Weights = model.weights or "int8"
    draft = load_model(speculative.draft_model, weights=weights, kv_dtype=target.config.kv_dtype)  # its cache numerics
    _same_tokenizer(speculative.draft_model, draft, target)
    assert isinstance(draft.model, Transformer)      # load_model's, never the device forward
    return DraftLM.full(draft.model)


def _device_draft_lm(target: LoadedModel, speculative: SpeculativeConfig) -> DeviceDraftLM:
    """The device runner's draft: the target's first layers, or a draft model's float weights moved
    into the target's forward (its device and dtype)."""
    model = target.model
    assert isinstance(model, DeviceLlama)
    if "self-draft" in speculative.drafters:
        return device_draft_lm(model, min(speculative.self_draft_layers, target.config.n_layers))
    given = speculative.draft_lm
    if given is None:
        assert speculative.draft_model is not None
        loaded = load_model(speculative.draft_model, weights="float")
        _same_tokenizer(speculative.draft_model, loaded, target)
        assert isinstance(loaded.model, Transformer)
        given = DraftLM.full(loaded.model)
    weights = given.model if isinstance(given.model, DeviceLlama) else \
        DeviceLlama.from_transformer(given.model, model.device, model.embed.dtype)
    head = getattr(given.head, "weight", None)
    return device_draft_lm(weights, given.n_layers, head, given.d2t)


def _same_tokenizer(name: str, draft: LoadedModel, target: LoadedModel) -> None:
    if draft.tokenizer.vocab_size != target.tokenizer.vocab_size or \
            draft.tokenizer.eos_token_ids != target.tokenizer.eos_token_ids:
        raise UnsupportedModelError(
            f"draft model {name!r} has another tokenizer than the target "
            f"({draft.tokenizer.vocab_size} vs {target.tokenizer.vocab_size} ids): a draft must share it")
