"""The device forward (models/device_llama.py): close to the CPU fp32 reference, and bitwise
batch-invariant (a row's logits are the same alone, in a verify chunk, and next to other sequences).
Every law runs on the CPU (float32, torch reference ops) and, with CUDA, on the GPU (bf16, Triton);
graph capture is CUDA-only and skips without it."""
from __future__ import annotations

import pytest
import torch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from interlock.models.batch import SeqChunk, build_batch  # noqa: E402
from interlock.models.config import ModelConfig, tiny_config  # noqa: E402
from interlock.models.kv_cache import PagedKVCache  # noqa: E402
from interlock.models.llama import random_transformer  # noqa: E402

PROMPT = list(range(40, 40 + 23))
EXTRA = [5, 6, 7, 8]
MAX_BLOCKS = 16


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=CUDA)])
def models(request):
    from interlock.models.device_llama import DeviceLlama

    cfg = tiny_config(1088).replace(max_position=256)
    cpu = random_transformer(cfg, seed=3)
    for p in cpu.parameters():            # the reference gets the same bf16-rounded weights
        p.data = p.data.to(torch.bfloat16).float()
    cpu.build("float")
    dtype = torch.bfloat16 if request.param == "cuda" else torch.float32
    return cfg, cpu, DeviceLlama.from_transformer(cpu, request.param, dtype, gemm_rows=16)


def _cache(cfg: ModelConfig, model) -> PagedKVCache:
    kv = PagedKVCache(model.config, num_blocks=64, block_size=4, device=model.device)
    kv.add_sequence(999)
    kv.reserve(999, 4)                    # block 0 belongs to nobody but padding rows
    return kv


def _run(model, kv, chunks, rows=None):
    from interlock.models.device_llama import step_inputs

    return model(step_inputs(chunks, kv, rows=rows, max_blocks=MAX_BLOCKS, pad_slot=0, device=model.device), kv)


def _prefill(model, kv, seq, prompt):
    kv.add_sequence(seq)
    return _run(model, kv, [SeqChunk(seq, tuple(prompt), kv.reserve(seq, len(prompt)), ())])


def test_close_to_the_cpu_fp32_reference(models) -> None:
    cfg, cpu, cuda = models
    kv = _cache(cfg, cuda)
    out = _prefill(cuda, kv, 0, PROMPT)                                          # [23, V]
    kv_ref = PagedKVCache(cfg, num_blocks=64, block_size=4)
    kv_ref.add_sequence(0)
    kv_ref.reserve(0, len(PROMPT))
    ref = cpu(build_batch([SeqChunk(0, tuple(PROMPT), 0, tuple(range(len(PROMPT))))], kv_ref), kv_ref)
    err = float((out.cpu() - ref).norm() / ref.norm())
    assert err < (3e-2 if cuda.device.type == "cuda" else 1e-4), err            # bf16 activations on CUDA
    assert float((out.cpu().argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.8


def test_rows_are_bitwise_the_same_alone_in_a_verify_chunk_and_in_a_batch(models) -> None:
    cfg, _, cuda = models
    kv = _cache(cfg, cuda)                                   # decoded one token per step, alone
    _prefill(cuda, kv, 0, PROMPT)
    alone = torch.cat([_run(cuda, kv, [SeqChunk(0, (t,), kv.reserve(0, 1), (0,))]) for t in EXTRA])

    kv = _cache(cfg, cuda)                                   # one verify chunk of 4 rows
    _prefill(cuda, kv, 0, PROMPT)
    chunk = _run(cuda, kv, [SeqChunk(0, tuple(EXTRA), kv.reserve(0, 4), (0, 1, 2, 3))])
    assert torch.equal(chunk, alone)

    kv = _cache(cfg, cuda)                                   # the chunk next to another sequence, padded
    _prefill(cuda, kv, 1, list(range(500, 520)))
    _prefill(cuda, kv, 0, PROMPT)
    kv_rows = [SeqChunk(1, (77,), kv.reserve(1, 1), (0,)), SeqChunk(0, tuple(EXTRA), kv.reserve(0, 4), (0, 1, 2, 3))]
    batch = _run(cuda, kv, kv_rows, rows=24)           # 24 rows: two GEMMs of 16 rows each
    assert torch.equal(batch[1:5], alone)


def _timeline(device: torch.device):
    """The timeline a device runner gets: CUDA's, or on the CPU the one that obeys CUDA's rules."""
    if device.type == "cuda":
        from interlock.streams.cuda_timeline import CudaTimeline

        return CudaTimeline(device)
    from interlock.streams.cuda_rules import CudaRulesTimeline

    return CudaRulesTimeline()


@torch.inference_mode()
def _fill_nan(x: torch.Tensor) -> None:
    x.fill_(float("nan"))


async def test_forward_replays_in_a_captured_program(models) -> None:
    """A CUDA graph on CUDA; on the CPU the CUDA-rules timeline's program (its ops replayed, not its
    Python), so a changed signature or a host sync in the forward fails CI, not the GPU run."""
    from interlock.models.device_llama import step_inputs

    cfg, _, dev = models
    kv = _cache(cfg, dev)
    _prefill(dev, kv, 0, PROMPT)
    start = kv.reserve(0, 4)
    inputs = step_inputs([SeqChunk(0, tuple(EXTRA), start, (0, 1, 2, 3))], kv, max_blocks=MAX_BLOCKS,
                         device=dev.device)
    eager = dev(inputs, kv).clone()
    out: dict[str, torch.Tensor] = {}

    def forward() -> None:
        out["logits"] = dev(inputs, kv)

    with _timeline(dev.device) as timeline:
        timeline.model.launch(forward)                 # warm up (Triton compiles) off the capture
        with timeline.capture() as program:
            timeline.model.launch(forward)
        timeline.model.launch(_fill_nan, out["logits"])     # what the replay must overwrite
        timeline.replay(program)
        await timeline.model.synchronize()
        program.close()
    assert torch.equal(out["logits"], eager)


def test_greedy_speculative_equals_greedy_plain(models) -> None:
    """Verify chunks of 3 drafts (some wrong) + the Triton greedy verifier reproduce one-token-at-a-time
    greedy decoding token for token, KV rewinds included: the exactness the engine relies on."""
    from interlock.kernels.rejection import rejection_sample_greedy

    cfg, _, cuda = models
    steps, k, vocab = 24, 3, cfg.vocab_size
    kv = _cache(cfg, cuda)
    plain = [int(_prefill(cuda, kv, 0, PROMPT)[-1].argmax())]
    while len(plain) < steps + k + 1:
        logits = _run(cuda, kv, [SeqChunk(0, (plain[-1],), kv.reserve(0, 1), (0,))])
        plain.append(int(logits[0].argmax()))

    kv = _cache(cfg, cuda)
    out = [int(_prefill(cuda, kv, 0, PROMPT)[-1].argmax())]
    rejected = 0
    while len(out) < steps:
        drafts = plain[len(out): len(out) + k]
        if len(out) % 3 == 1:
            drafts[1] = (drafts[1] + 1) % vocab                # a wrong draft: rejected, then rewound
        logits = _run(cuda, kv, [SeqChunk(0, (out[-1], *drafts), kv.reserve(0, k + 1), tuple(range(k + 1)))])
        result = rejection_sample_greedy(logits.view(1, k + 1, vocab), torch.tensor([drafts], device=cuda.device),
                                         torch.tensor([k], device=cuda.device))
        accepted = int(result.num_accepted[0])
        rejected += accepted < k
        out.extend(result.tokens[0, : accepted + 1].tolist())
        kv.rewind(0, k - accepted)                            # positions of the rejected drafts
    assert out[:steps] == plain[:steps] and rejected > 0


def _slow_attention(q, k, v, tables, row_table, positions, hkv: int, bs: int, scale: float, window: int):
    """Row by row, head by head: softmax(q k^T * scale) v over the row's visible positions."""
    t, d = q.shape[0], k.shape[-1]
    g = q.shape[1] // d // hkv
    out = torch.zeros(t, hkv * g * d)
    for r in range(t):
        n = int(positions[r]) + 1
        seen = range(max(0, n - window) if window else 0, n)
        slots = [int(tables[int(row_table[r]), p // bs]) * bs + p % bs for p in seen]
        for h in range(hkv * g):
            qh = q[r, h * d: (h + 1) * d].double()
            keys, values = k[slots, h // g].double(), v[slots, h // g].double()
            out[r, h * d: (h + 1) * d] = ((keys @ qh * scale).softmax(0) @ values).float()
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("window", [0, 5, 40])
@pytest.mark.parametrize("head_dim", [32, 96])
async def test_paged_attention_window_and_scale_follow_the_slow_reference(device: str, window: int,
                                                                         head_dim: int) -> None:
    """The device's attention op (Triton on CUDA in bf16, the torch reference on the CPU), issued as
    device work on its timeline, against a per-row loop; head dim 96 is Phi-3-mini's (padded)."""
    from interlock.models.device_llama import DeviceLlama

    gen = torch.Generator().manual_seed(0)
    t, hkv, g, d, bs = 6, 2, 3, head_dim, 4
    k, v = torch.randn(64, hkv, d, generator=gen), torch.randn(64, hkv, d, generator=gen)
    q = torch.randn(t, hkv * g * d, generator=gen)
    tables = torch.stack([torch.randperm(16, generator=gen) for _ in range(t)]).int()
    row_table = torch.tensor([5, 0, 3, 1, 2, 4])
    positions = torch.tensor([3, 9, 17, 30, 41, 60])
    want = _slow_attention(q, k, v, tables, row_table, positions, hkv, bs, 0.3, window)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ops = DeviceLlama.random(tiny_config(64), device, dtype=dtype).ops()
    args = [x.to(device, dtype) for x in (q, k, v)] + [x.to(device) for x in (tables, row_table, positions)]
    out: dict[str, torch.Tensor] = {}
    with _timeline(torch.device(device)) as timeline:
        timeline.model.launch(lambda: out.update(got=ops.paged_attention(*args, hkv, bs, 0.3, window)))
        await timeline.model.synchronize()
    err = (out["got"].float().cpu() - want).abs().max().item()
    assert err < (0.05 if device == "cuda" else 1e-4), err
