"""Every vocabulary size from 1 to 70, with and without skip rows and a draft->target map, against
the slow reference: the torch backend always; the Triton kernel's logic under Triton's interpreter
(on the CPU, in a subprocess: the interpreter is chosen when kernels are defined); the Triton
kernel itself on CUDA (vocab = 1 once left rows unmasked there)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from interlock.kernels.bitmask import apply_token_bitmask_

VOCABS = range(1, 71)


def cases(vocab: int, gen: torch.Generator, device: str = "cpu"):
    """(logits, bitmask, kwargs) for one vocabulary: plain, with skip rows, with d2t and a limit."""
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, words), generator=gen, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(6, vocab, generator=gen)
    rows = torch.tensor([3, 0, 0, 2, 1, 3])
    skip = torch.tensor([False, True, False, False, True, False])
    d2t = torch.randint(-3, 32 * words + 3, (vocab,), generator=gen)
    for kwargs in ({"rows": rows}, {"rows": rows, "skip": skip},
                   {"rows": rows, "skip": skip, "d2t": d2t, "mask_vocab_size": max(1, vocab - 2)}):
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        yield logits.to(device), bitmask.to(device), moved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_matches_the_reference_for_every_small_vocab(dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for vocab in VOCABS:
        for logits, bitmask, kwargs in cases(vocab, gen):
            got, want = logits.to(dtype), logits.to(dtype).clone()
            apply_token_bitmask_(got, bitmask, backend="torch", **kwargs)
            apply_token_bitmask_(want, bitmask, backend="reference", **kwargs)
            assert torch.equal(got, want), (vocab, list(kwargs))


INTERPRETED = textwrap.dedent("""
    import torch
    from interlock.kernels.bitmask import apply_token_bitmask_
    from interlock.kernels.bitmask_triton import apply_token_bitmask_triton_
    from test_bitmask_vocab_sizes import VOCABS, cases
    gen = torch.Generator().manual_seed(1)
    bad = []
    for vocab in VOCABS:
        for logits, bitmask, kw in cases(vocab, gen):
            want = logits.clone()
            apply_token_bitmask_(want, bitmask, backend="reference", **kw)
            limit = min(32 * bitmask.shape[1], kw.get("mask_vocab_size", 1 << 30))
            got = logits.clone()
            apply_token_bitmask_triton_(got, bitmask, kw.get("rows"), kw.get("skip"), kw.get("d2t"), limit)
            if not torch.equal(got, want):
                bad.append((vocab, sorted(kw)))
    print("BAD", bad)
""")


def test_the_triton_kernel_logic_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "BAD []" in done.stdout, done.stdout[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_matches_the_reference_for_every_small_vocab(dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    for vocab in VOCABS:
        for logits, bitmask, kwargs in cases(vocab, gen):
            want = logits.to(dtype).clone()
            apply_token_bitmask_(want, bitmask, backend="reference", **kwargs)
            got = logits.to(dtype).cuda()
            apply_token_bitmask_(got, bitmask.cuda(), backend="cuda",
                                 **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
            assert torch.equal(got.cpu(), want), (vocab, list(kwargs))


def test_the_torch_backend_writes_nothing_past_the_logits() -> None:
    """The fp32 CPU fast path (xgrammar's kernel) once wrote past small vocabularies' rows."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        for vocab in VOCABS:
            buf = torch.full((6 * vocab + 256,), 7.0)
            logits = buf[: 6 * vocab].view(6, vocab)
            logits.copy_(torch.randn(6, vocab, generator=gen))
            bitmask = torch.randint(-2**31, 2**31 - 1, (6, (vocab + 31) // 32), generator=gen,
                                    dtype=torch.int64).to(torch.int32)
            apply_token_bitmask_(logits, bitmask, skip=torch.tensor([False, True] * 3), backend="torch")
            assert torch.all(buf[6 * vocab:] == 7.0), vocab
