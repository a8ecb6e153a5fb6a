"""The target model: a Llama-family forward over a paged KV cache, its loaders and tokenizer.

`load_model(name_or_path)` gives a `LoadedModel` (weights, config, tokenizer); `PagedKVCache`
owns the KV blocks; `Transformer.forward(batch, kv)` runs one packed batch.
"""
