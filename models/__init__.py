"""The target model: one decoder forward over a paged KV cache for every family (Llama, Mistral,
Qwen2/3, Gemma 3, Phi-3: their differences are data in config.py), its loaders and tokenizer.

`load_model(name_or_path)` gives a `LoadedModel` (weights, config, tokenizer) of what names.py says
a name stands for (importing no torch: the CLI checks --model with it at once), reading each
family's tensors where checkpoint.py says its checkpoints keep them; `PagedKVCache`
owns the KV blocks, drawn from `prefix_cache.BlockPool` (refcounts, content-addressed full blocks
shared between requests, an LRU of cached ones); `Transformer.forward(batch, kv)` runs one packed batch:
decode / verify rows (and, with `rows_prefill`, prompt chunks) through the native batch-invariant
rows path, other prompt chunks through dense GEMMs (bf16 or fp32: linear.py) (`batch.py` splits them).
`device_llama.py` is the same forward over fixed-shape `StepInputs` tensors (batch-invariant,
capturable in a CUDA graph): bf16 on CUDA with the row-independent Triton ops of `triton_ops.py`,
float32 on the CPU with their torch references (`reference_ops.py`), which is how CI tests it;
`kernel_rules.py` is what the Triton ops assume of their inputs, checked by both.
Weights (linear.py): int4 (the default for a GGUF), int8 or float. packed.py converts a GGUF
tensor by tensor into the memory-mapped per-layer cache a warm start maps (quantized kinds);
gguf_file.py reads a GGUF's metadata and tensor table fast; weight_cache.py keeps the float path's.
Tensor parallelism, which runs this forward sharded over worker processes, is parallel/'s.
"""
