"""Our native CPU kernels (csrc/): int8_linear, row_attention, rms_norm, and their references.

The library is built on first use with the machine's compiler into torch's extension cache (one
~10 s compile per machine and source version) and registers torch.ops.interlock_cpu.*. The
forward (models/) calls those ops directly once `available()` says they built; the functions here
add argument checks and the slow obvious versions the tests compare against.

- int8_linear(x, q, scale): y = (x @ q^T) * scale, per-row int8 weights; the native kernel
  quantizes the activations to int8 in blocks of 32 first (`quantize_activations`).
- row_attention(q, k_cache, v_cache, blocks, block_size, start, scale, window): decode / verify rows
  of one sequence over its paged context (row r sees positions 0 .. start + r, or with a sliding
  window W > 0 only start + r - W + 1 .. start + r).
- rms_norm(x, weight, eps): row-wise RMSNorm.
- masked_argmax(logits, bitmask, mask_rows, vocab): per row, the largest logit its grammar row
  allows and its id (greedy verification's only read of the logits).
- head_argmax(x, q, scale, bitmask, mask_rows, vocab, max_sparse): masked_argmax of the int8 head
  x @ q^T * scale, computing only the allowed logits of rows whose mask allows few ids.

Each computes a row from that row's data alone, in a fixed order: bitwise batch invariant.

int8_linear backends:
- "native": our kernels (csrc/int8_linear.h, csrc/int8_amx.h): activations quantized per block
  of 32 (one fp32 scale each, as llama.cpp's Q8_0), int8 dots on AMX tiles (Sapphire Rapids
  and later), AVX512-VNNI or AVX2 (maddubs / madd); 4 rows cost ~1.1x one row; bitwise
  row-independent. VNNI and AVX2 give the portable kernel's bits (INTERLOCK_SIMD=0 builds that).
- "torch": torch's `_weight_int8pack_mm` (activations rounded to bf16; also row-independent).
- "reference": the obvious float64 matmul of the same quantized activations, for tests.
- "auto": "native" when it builds and the shapes fit (K a multiple of 32), else "torch". The
  choice is made once per process (`available`), so a model never mixes the two.

Set INTERLOCK_NATIVE_KERNELS=0 to never build or use the native kernels, INTERLOCK_SIMD=0 to build
them without any SIMD code (csrc/simd.h): the portable C++ that each SIMD path is tested against
(bit for bit for int8_linear) and that the benchmarks time as "before".
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path

import torch

from interlock.logs import get_logger

_CSRC = Path(__file__).parent / "csrc"
BACKENDS = ("auto", "native", "torch", "reference")
ACT_BLOCK = 32           # activations per int8 quantization scale in the native int8_linear
# How csrc/ is compiled (here and by the benchmarks that build other versions of it beside this one).
# -fopenmp: at::parallel_for is header code that forks only when compiled with OpenMP; the library
# it links is the libgomp.so.1 torch has already loaded (same soname), one pool.
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
# INTERLOCK_SIMD=avx2: AVX-512 (and so VNNI and AMX) compiled out, so that an AVX-512 machine builds
# and tests the AVX2 kernels too (every SIMD path must give the portable kernel's bits).
AVX2_ONLY = ["-mno-avx512f"]
# What the library registers under torch.ops.interlock_cpu (and what the model and verifier call).
OPS = ("int8_linear", "int8_kernel", "int4_linear", "int4_kernel", "row_attention", "rms_norm", "rows_forward",
       "masked_argmax", "head_argmax")


@functools.cache
def available() -> bool:
    """Build (or load the cached build of) the native kernels; False, logged once, if it cannot."""
    if os.environ.get("INTERLOCK_NATIVE_KERNELS", "1") == "0":
        return False
    log = get_logger("interlock.kernels")
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()

        # torch's build cache hashes the .cpp only; naming the build after every file in csrc/ makes
        # an edited header rebuild too. Its build.ninja names the sources' path, so two checkouts of
        # the same sources under one name rebuilt each other's library on every start (a minute of
        # "loading"): the path is in the name too.
        files = b"".join(p.read_bytes() for p in sorted(_CSRC.iterdir()))
        digest = hashlib.sha256(files + str(_CSRC).encode()).hexdigest()[:12]
        simd = os.environ.get("INTERLOCK_SIMD", "1")
        flags = {"0": ["-DINTERLOCK_NO_SIMD"], "avx2": AVX2_ONLY}.get(simd, [])
        suffix = {"0": "_portable", "avx2": "_avx2"}.get(simd, "")
        load(name=f"interlock_cpu_{digest}{suffix}", sources=[str(_CSRC / "ops.cpp")], extra_cflags=CFLAGS + flags,
             extra_ldflags=LDFLAGS, is_python_module=False, verbose=False)
        for op in OPS:    # raises if the library did not register
            getattr(torch.ops.interlock_cpu, op)
    except Exception as exc:                   # no compiler, no headers, an unsupported CPU ...
        log.warning("native CPU kernels unavailable; using torch ops", error=str(exc)[:300])
        return False
    return True


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` wheel (a dependency) puts it beside this Python,
    which is not on PATH when a venv's python is run without activating the venv."""
    if shutil.which("ninja") is not None:
        return
    here = Path(sys.executable).parent
    if (here / "ninja").exists():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """x: [M, K] float; q: [N, K] int8; scale: [N] float -> [M, N] fp32."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if x.dim() != 2 or q.dim() != 2 or x.shape[1] != q.shape[1] or scale.shape != (q.shape[0],):
        raise ValueError(f"shapes x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)} do not match")
    if q.dtype != torch.int8:
        raise ValueError(f"q must be int8, got {q.dtype}")
    if backend == "auto":
        backend = "native" if native_fits(q) else "torch"
    if backend == "reference":
        values, scales = quantize_activations(x)
        xq = values.double() * scales.double().repeat_interleave(ACT_BLOCK, dim=1)
        return ((xq @ q.double().T) * scale.double()).float()
    if backend == "torch":
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), q, scale.to(torch.bfloat16)).float()
    if not native_fits(q):
        raise ValueError(f"native int8_linear needs a CPU int8 weight with K % {ACT_BLOCK} == 0 and a built kernel")
    return torch.ops.interlock_cpu.int8_linear(x.float().contiguous(), q.contiguous(), scale.float().contiguous())


def int4_linear(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, backend: str = "native") -> torch.Tensor:
    """x: [M, K] float; w: [N, row_bytes(K)] uint8 records and offsets [N, K / 32] fp16
    (kernels/int4_pack.py) -> [M, N] fp32.

    "native": csrc/int4_linear.h (activations quantized to int8 per super-block of 256);
    "reference": the obvious float64 matmul of the same quantized activations and the weights the
    records stand for, for tests."""
    from interlock.kernels.int4_pack import row_bytes

    k = x.shape[-1]
    if x.dim() != 2 or w.dim() != 2 or w.dtype != torch.uint8 or k % 64 or w.shape[1] != row_bytes(k) \
            or offsets.shape != (w.shape[0], k // 32) or offsets.dtype != torch.float16:
        raise ValueError(f"int4_linear: x [M, K] (K % 64 == 0), uint8 records [N, row_bytes(K)] and fp16 offsets "
                         f"[N, K / 32]; got x {tuple(x.shape)}, w {tuple(w.shape)} {w.dtype}, offsets "
                         f"{tuple(offsets.shape)} {offsets.dtype}")
    if backend == "reference":
        from interlock.kernels.int4_pack import dequantize_int4

        return (quantize_activations_int4(x).double() @ dequantize_int4(w, offsets).double().T).float()
    if backend != "native" or not available():
        raise ValueError(f"int4_linear backends: 'native' (built: {available()}) and 'reference'")
    return torch.ops.interlock_cpu.int4_linear(x.float().contiguous(), w.contiguous(), offsets.contiguous())


def int4_kernel() -> str:
    """The native int4_linear this process runs: "vnni" (also on AMX machines), "avx2", "portable",
    or "none" when the native kernels did not build."""
    return torch.ops.interlock_cpu.int4_kernel() if available() else "none"


def int8_kernel() -> str:
    """The native int8_linear this process runs: "amx" (tiles; one row on VNNI, bit-identical),
    "vnni" (AVX512-VNNI; also where INTERLOCK_AMX=0 or the OS refuses the tiles), "avx2" (AVX2 +
    FMA, bit-identical to "portable"), "portable" (plain C++; also where INTERLOCK_SIMD=0), or
    "none" when the native kernels did not build."""
    return torch.ops.interlock_cpu.int8_kernel() if available() else "none"


SIMD_KERNELS = ("amx", "vnni", "avx2")


def simd_kernels() -> bool:
    """Whether int8_kernel() is SIMD code: where the defaults take the rows prompt path and an fp16
    KV cache (models/llama.py rows_prefill_default, models/loader.py default_kv_dtype)."""
    return int8_kernel() in SIMD_KERNELS


def native_fits(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.shape[1] % ACT_BLOCK == 0 and available()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> int8 values [M, K] and fp32 scales [M, K / 32], x ≈ values * scale of its block.

    What the native int8_linear does to its activations, in fp32 as it does: scale = amax / 127,
    values = round(x * (127 / amax)) to nearest even; an all-zero block gets scale 0.
    """
    m, k = x.shape
    if k % ACT_BLOCK:
        raise ValueError(f"K must be a multiple of {ACT_BLOCK}, got {k}")
    blocks = x.float().reshape(m, k // ACT_BLOCK, ACT_BLOCK)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    values = torch.round(blocks * inv[..., None]).to(torch.int8).reshape(m, k)
    return values, amax / 127.0


def quantize_activations_int4(x: torch.Tensor) -> torch.Tensor:
    """What the native int4_linear computes with instead of x [M, K], in fp32 as it does: per
    super-block of 256 (the last of a row shorter) A = amax / 127; per block of 32 the largest e in
    0..7 with 2^e * (block amax) <= amax; values round(x * ((127 / amax) * 2^e)) times A / 2^e."""
    from interlock.kernels.int4_pack import super_sizes

    parts = []
    for block in x.float().split(super_sizes(x.shape[1]), dim=1):
        m, w = block.shape
        amax = block.abs().amax(-1, keepdim=True)
        inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
        b = block.reshape(m, w // 32, 32)
        bmax = b.abs().amax(-1)
        e = torch.zeros_like(bmax)
        for _ in range(7):                               # the kernel's loop: one more doubling while it fits
            e = torch.where((e < 7) & (bmax * 2 ** (e + 1) <= amax), e + 1, e)
        values = torch.round(b * (inv * 2 ** e)[..., None])
        parts.append((values * ((amax / 127.0) / 2 ** e)[..., None]).reshape(m, w))
    return torch.cat(parts, dim=1)


def row_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                  block_size: int, start: int, scale: float, window: int = 0, backend: str = "native") -> torch.Tensor:
    """q: [n, H, D]; caches: [slots, Hkv, D]; blocks: the sequence's block table -> [n, H * D]."""
    if backend == "reference":
        return row_attention_reference(q, k_cache, v_cache, blocks, block_size, start, scale, window)
    if backend != "native" or not available():
        raise ValueError(f"row_attention backends: 'native' (built: {available()}) and 'reference'")
    return torch.ops.interlock_cpu.row_attention(q.contiguous(), k_cache, v_cache, blocks.contiguous(),
                                                 block_size, start, scale, window)


def row_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                            block_size: int, start: int, scale: float, window: int = 0) -> torch.Tensor:
    n, h, d = q.shape
    g = h // k_cache.shape[1]
    out = torch.empty(n, h * d)
    for r in range(n):
        end = start + r + 1
        positions = torch.arange(max(0, end - window) if window else 0, end)
        slots = blocks[positions // block_size] * block_size + positions % block_size
        keys = k_cache[slots].double().repeat_interleave(g, dim=1)              # [L, H, D]
        values = v_cache[slots].double().repeat_interleave(g, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[r].double(), keys) * scale, dim=-1)
        out[r] = torch.einsum("hl,lhd->hd", weights, values).reshape(-1).float()
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "native") -> torch.Tensor:
    """x: [T, E] fp32; weight: [E] -> weight * x / sqrt(mean(x^2) + eps), row by row."""
    if backend == "reference":
        xd = x.double()
        return (weight.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).float()
    if backend != "native" or not available():
        raise ValueError(f"rms_norm backends: 'native' (built: {available()}) and 'reference'")
    return torch.ops.interlock_cpu.rms_norm(x.contiguous(), weight.float().contiguous(), eps)


def masked_argmax(logits: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor, vocab: int,
                  backend: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] fp32; bitmask [M, W] packed int32; mask_rows [R] (-1: no mask) -> (ids [R],
    peaks [R]): over ids < vocab that the row's mask allows, the lowest id of the largest logit and
    that logit; a peak is NaN if an allowed logit is, -inf if none is allowed above -inf."""
    if backend == "reference":
        return masked_argmax_reference(logits, bitmask, mask_rows, vocab)
    if backend != "native" or not available():
        raise ValueError(f"masked_argmax backends: 'native' (built: {available()}) and 'reference'")
    return torch.ops.interlock_cpu.masked_argmax(logits, bitmask, mask_rows, vocab)


def masked_argmax_reference(logits: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor,
                            vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the verifier's general path computes: mask (kernels/bitmask.py), then amax and argmax."""
    from interlock.kernels.bitmask import apply_token_bitmask_

    x = logits[:, :vocab].float().clone()
    apply_token_bitmask_(x, bitmask, rows=mask_rows.clamp(min=0), skip=mask_rows < 0, backend="torch")
    peaks = x.amax(-1)                                         # NaN if an allowed logit is
    ids = torch.where(peaks > float("-inf"), x.argmax(-1), 0)  # first of the largest; 0 for NaN / none
    return ids, peaks


def head_argmax(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor,
                vocab: int, max_sparse: int, backend: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """masked_argmax(int8_linear(x, q, scale), bitmask, mask_rows, vocab), bit for bit; natively, a
    row whose mask allows at most max_sparse ids computes only those logits (csrc/head_argmax.h),
    and a row marked -2 (nobody reads it) is skipped: id 0, peak -inf. "dense" computes the whole
    head and takes masked_argmax: what the native path must equal."""
    if backend == "dense":
        ids, peaks = masked_argmax(int8_linear(x, q, scale, backend="native"), bitmask, mask_rows.clamp(min=-1), vocab)
        skip = mask_rows == -2
        return ids.masked_fill(skip, 0), peaks.masked_fill(skip, float("-inf"))
    if backend != "native" or not available():
        raise ValueError(f"head_argmax backends: 'native' (built: {available()}) and 'dense'")
    return torch.ops.interlock_cpu.head_argmax(x.float().contiguous(), q.contiguous(), scale.float().contiguous(),
                                               bitmask, mask_rows, vocab, max_sparse)
