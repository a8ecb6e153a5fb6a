"""Small aliases shared by every folder, so signatures say what an int means."""
from __future__ import annotations

import re
from typing import Literal, TypeAlias

TokenId: TypeAlias = int
RequestId: TypeAlias = str
SeqId: TypeAlias = int          # one sequence in the KV cache (a request may own several: CFG)
SlotId: TypeAlias = int         # a row of the batch, 0..max_batch_size-1
BlockId: TypeAlias = int        # one block of the paged KV pool

Dtype: TypeAlias = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[Dtype, ...] = ("float32", "bfloat16", "float16")
# How prompt chunks are computed (EngineConfig.prefill): "rows" (the int8 batch-invariant rows path),
# "dense" (GEMMs with the unquantized weights: bf16 or fp32, models/linear.py dense_dtype), "auto"
# (rows where the native kernels run SIMD code: SIMD_CPUS).
# The CPUs whose native int8 kernels are SIMD code (kernels/native.py SIMD_KERNELS), where "auto"
# takes the rows prompt path and an fp16 KV cache: the one wording the CLI's help and its docs use.
SIMD_CPUS = "AMX, AVX512-VNNI or AVX2"
PrefillMode: TypeAlias = Literal["auto", "rows", "dense"]
PREFILL_MODES: tuple[PrefillMode, ...] = ("auto", "rows", "dense")
DEFAULT_PREFILL: PrefillMode = "auto"
# EngineConfig.device: checked by the engine and by the CLI before anything heavy is imported
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
FinishReason: TypeAlias = Literal["stop", "length", "grammar", "cancelled", "error"]
