"""GGUF files of real models' shapes with random weights, for benchmarks/shapes.py.

Only speed is meaningful in these files: the weights are random, written directly as valid
quantized blocks (no float model is ever made or quantized), with scales chosen so that every
dequantized matrix has mean ~0 and standard deviation ~`SIGMA` (a forward stays finite):
- Q8_0 (32 weights, 34 bytes): random int8 values, one fp16 scale d ~ SIGMA / 73.6;
- Q4_K (256 weights, 144 bytes): random nibbles q, all eight 6-bit sub-block scales and mins 32,
  d ~ SIGMA / (32 * 4.61), dmin = 7.5 d, so w = 32 d (q - 7.5);
- Q6_K (256 weights, 210 bytes): random 6-bit q, all sixteen int8 scales 8, d ~ SIGMA / (8 * 18.5),
  so w = 8 d (q - 32).
Each block's d varies by +-25% so blocks differ. Norm weights are ones; Qwen2's q/k/v biases are
small normals; a Llama 3 shape gets the `rope_freqs` tensor of its RoPE scaling (llama3 type).

The type of each matrix follows llama.cpp's quantizer (src/llama-quant.cpp,
`llama_tensor_get_type_impl`, as vendored in llama-cpp-python 0.3.36) for the two file types:
- Q8_0: every matrix Q8_0;
- Q4_K_M: Q4_K, except attn_v and ffn_down on the "use_more_bits" layers (i < n/8, i >= 7n/8, or
  (i - n/8) % 3 == 2), which get Q6_K, and the output matrix, Q6_K (with tied embeddings
  token_embd is the output and gets Q6_K; an untied token_embd stays Q4_K). Matrices whose input
  width is not a multiple of 256 are refused here (llama.cpp would fall back to other types; the
  real shapes never need it).

The tokenizer is the embedded SmolLM2's (GPT-2 BPE, 49,152 tokens, its merges, specials and chat
template), padded with NORMAL tokens "[PAD<i>]" (which no merge produces) up to the shape's
vocabulary: llama.cpp and interlock (through transformers) both read it. `tokenizer_vocab` keeps
only the first ids (and the merges among them) for small test files (`Shape.tokenizer_vocab`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIGMA = 0.02
FORMAT = 1                       # bump when the files' contents change: names carry it
FILE_TYPES = ("Q8_0", "Q4_K_M")


@dataclass(frozen=True)
class Shape:
    """A model's shape, as its GGUF metadata states it."""

    name: str
    arch: str                    # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    head_dim: int = 0            # 0: hidden // heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    context: int = 8192
    llama3_rope: float = 0.0     # the llama3 RoPE scaling factor (0: none)
    tokenizer_vocab: int | None = None      # keep only this many of the tokenizer's ids (small test files)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


SHAPES = {
    "1b": Shape("llama-3.2-1b", "llama", hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256,
                tied=True, head_dim=64, rope_theta=500000.0, context=131072, llama3_rope=32.0),
    "3b": Shape("qwen2.5-3b", "qwen2", hidden=2048, layers=36, heads=16, kv_heads=2, ffn=11008, vocab=151936,
                tied=True, qkv_bias=True, head_dim=128, rope_theta=1000000.0, rms_eps=1e-6, context=32768),
    "8b": Shape("llama-3.1-8b", "llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                tied=False, head_dim=128, rope_theta=500000.0, context=131072, llama3_rope=8.0),
}


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for which layers' attn_v / ffn_down get more bits (integer division as in C)."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_type(name: str, file_type: str, n_layers: int, tied: bool) -> str:
    """The GGML type llama.cpp's quantizer gives matrix `name` in a file of `file_type`."""
    if file_type == "Q8_0":
        return "Q8_0"
    if file_type != "Q4_K_M":
        raise ValueError(f"file type must be one of {FILE_TYPES}, got {file_type!r}")
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    if name.startswith("blk.") and name.endswith((".attn_v.weight", ".ffn_down.weight")):
        return "Q6_K" if use_more_bits(int(name.split(".")[1]), n_layers) else "Q4_K"
    return "Q4_K"


def matrices(shape: Shape) -> list[tuple[str, int, int]]:
    """(name, rows = output features, columns = input features) of every matrix, in file order."""
    h, q, kv, f = shape.hidden, shape.heads * shape.hd, shape.kv_heads * shape.hd, shape.ffn
    out = [("token_embd.weight", shape.vocab, h)]
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_q.weight", q, h), (f"blk.{i}.attn_k.weight", kv, h),
                (f"blk.{i}.attn_v.weight", kv, h), (f"blk.{i}.attn_output.weight", h, q),
                (f"blk.{i}.ffn_gate.weight", f, h), (f"blk.{i}.ffn_up.weight", f, h),
                (f"blk.{i}.ffn_down.weight", h, f)]
    if not shape.tied:
        out.append(("output.weight", shape.vocab, h))
    return out


def vectors(shape: Shape) -> list[tuple[str, int]]:
    """(name, length) of every F32 vector: norms, biases, rope_freqs."""
    out = [("rope_freqs.weight", shape.hd // 2)] if shape.llama3_rope else []
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_norm.weight", shape.hidden), (f"blk.{i}.ffn_norm.weight", shape.hidden)]
        if shape.qkv_bias:
            out += [(f"blk.{i}.attn_q.bias", shape.heads * shape.hd), (f"blk.{i}.attn_k.bias", shape.kv_heads * shape.hd),
                    (f"blk.{i}.attn_v.bias", shape.kv_heads * shape.hd)]
    return out + [("output_norm.weight", shape.hidden)]


# --- blocks ------------------------------------------------------------------------------------

BLOCK = {"Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}      # weights, bytes per block
# Q4_K's 12 scale bytes with every 6-bit sub-block scale and min = 32 (llama.cpp get_scale_min_k4:
# bytes 0-3 scales 0-3 with bits 6-7 the high bits of scales 4-7, 4-7 the mins likewise, 8-11 the
# low nibbles of scales / mins 4-7).
_Q4K_SCALES = np.array([32 | (2 << 6)] * 8 + [0] * 4, dtype=np.uint8)


def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(kind: str, n_blocks: int, rng: np.random.Generator, sigma: float = SIGMA) -> np.ndarray:
    """n_blocks valid `kind` blocks, [n_blocks, block bytes] uint8, dequantizing to ~N(0, sigma)-sized values."""
    size = BLOCK[kind][1]
    raw = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    jitter = rng.uniform(0.75, 1.25, n_blocks)
    if kind == "Q8_0":
        raw[:, 0:2] = _half(jitter * sigma / 73.6)
    elif kind == "Q4_K":
        d = jitter * sigma / (32 * 4.61)
        raw[:, 0:2], raw[:, 2:4], raw[:, 4:16] = _half(d), _half(7.5 * d), _Q4K_SCALES
    elif kind == "Q6_K":
        raw[:, 192:208] = 8
        raw[:, 208:210] = _half(jitter * sigma / (8 * 18.5))
    else:
        raise ValueError(f"no random blocks for {kind!r}")
    return raw


def random_matrix(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] uint8 of `kind` blocks (as GGUFWriter takes quantized data)."""
    per, size = BLOCK[kind]
    if cols % per:
        raise ValueError(f"{cols} columns do not split into {kind} blocks of {per}")
    return random_blocks(kind, rows * cols // per, rng).reshape(rows, cols // per * size)


def llama3_rope_factors(shape: Shape, low: float = 1.0, high: float = 4.0, original: int = 8192) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs for RoPE scaling type llama3."""
    out = []
    for i in range(0, shape.hd, 2):
        wavelen = 2 * math.pi * shape.rope_theta ** (i / shape.hd)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(shape.llama3_rope)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / shape.llama3_rope + smooth))
    return np.array(out, dtype=np.float32)


# --- tokenizer ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizerFields:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    scalars: dict[str, object]       # the other tokenizer.* fields, by key


def embedded_tokenizer_fields(keep: int | None = None) -> TokenizerFields:
    """The embedded SmolLM2 GGUF's tokenizer metadata; keep: only ids < keep, and the merges among them."""
    tokens, types, merges, scalars = _embedded_tokenizer()
    if keep is not None:
        tokens, types = tokens[:keep], types[:keep]
        known = set(tokens)
        merges = tuple(m for m in merges if "".join(m.split(" ")) in known and all(p in known for p in m.split(" ")))
    return TokenizerFields(list(tokens), list(types), list(merges), dict(scalars))


@functools.cache
def _embedded_tokenizer() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...], tuple[tuple[str, object], ...]]:
    """Read once a process: parsing the file's metadata takes seconds."""
    import gguf

    from interlock.models.loader import embedded_gguf_path

    reader = gguf.GGUFReader(str(embedded_gguf_path()))
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    tokens, types, merges = (fields.pop(f"tokenizer.ggml.{k}") for k in ("tokens", "token_type", "merges"))
    return tuple(tokens), tuple(int(t) for t in types), tuple(merges), tuple(fields.items())


def _write_tokenizer(writer: object, tok: TokenizerFields, vocab: int) -> None:
    from gguf import GGUFValueType

    if vocab < len(tok.tokens):
        raise ValueError(f"a vocabulary of {vocab} is smaller than the tokenizer's {len(tok.tokens)} tokens")
    pad = vocab - len(tok.tokens)
    writer.add_token_list(tok.tokens + [f"[PAD{i}]" for i in range(pad)])
    writer.add_token_types(tok.types + [1] * pad)
    writer.add_token_merges(tok.merges)
    for key, value in tok.scalars.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_key_value(key, value, GGUFValueType.get_type(value))


# --- the file ----------------------------------------------------------------------------------

def file_name(shape: Shape, file_type: str) -> str:
    return f"{shape.name}-shape-random-v{FORMAT}.{file_type}.gguf"


def planned_tensors(shape: Shape, file_type: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, GGML type, (rows, columns) or (length,)) of every tensor the file holds, in order."""
    plan = [(name, "F32", (n,)) for name, n in vectors(shape)]
    plan += [(name, tensor_type(name, file_type, shape.layers, shape.tied), (rows, cols))
             for name, rows, cols in matrices(shape)]
    return plan


def _tensor_data(shape: Shape, name: str, kind: str, dims: tuple[int, ...],
                 rng: np.random.Generator) -> np.ndarray:
    if kind != "F32":
        return random_matrix(kind, dims[0], dims[1], rng)
    if name == "rope_freqs.weight":
        return llama3_rope_factors(shape)
    if name.endswith(".bias"):
        return rng.normal(0.0, SIGMA, dims).astype(np.float32)
    return np.ones(dims, dtype=np.float32)


def write_gguf(path: Path, shape: Shape, file_type: str, *, seed: int = 0) -> Path:
    """Write the file (tensor by tensor: memory stays at one tensor), atomically (temp name, then rename)."""
    import gguf

    if file_type not in FILE_TYPES:
        raise ValueError(f"file type must be one of {FILE_TYPES}, got {file_type!r}")
    tok = embedded_tokenizer_fields(shape.tokenizer_vocab)
    plan = planned_tensors(shape, file_type)
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), shape.arch)
    writer.add_name(f"{shape.name} shape, random weights")
    writer.add_description(f"interlock benchmarks/shape_gguf.py format {FORMAT}, seed {seed}: speed only")
    writer.add_file_type({"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M}[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.hd)
    writer.add_value_length(shape.hd)
    writer.add_rope_dimension_count(shape.hd)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    _write_tokenizer(writer, tok, shape.vocab)
    for name, kind, dims in plan:
        if kind == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * dims[0])
        else:
            per, size = BLOCK[kind]
            byte_shape = (dims[0], dims[1] // per * size)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1],
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, kind, dims in plan:
        writer.write_tensor_data(_tensor_data(shape, name, kind, dims, rng))
    writer.close()
    tmp.replace(path)
    return path


def head_and_layer_bytes(path: Path) -> int:
    """Bytes one decode token reads from the file: every blk.* tensor and the head (output.weight, or
    token_embd.weight where the embeddings are tied). The embedding lookup (one row) is left out."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    return head + sum(n for name, n in tensors.items() if name.startswith("blk."))


def iter_types(path: Path) -> Iterator[tuple[str, str]]:
    """(name, GGML type name) of every tensor in a file (what a test compares with the plan)."""
    import gguf

    for t in gguf.GGUFReader(str(path)).tensors:
        yield t.name, t.tensor_type.name
