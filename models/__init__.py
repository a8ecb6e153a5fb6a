"""The target model: a Llama-family forward over a paged KV cache, its loaders and tokenizer.

`load_model(name_or_path)` gives a `LoadedModel` (weights, config, tokenizer); `PagedKVCache`
owns the KV blocks, drawn from `prefix_cache.BlockPool` (refcounts, content-addressed full blocks
shared between requests, an LRU of cached ones); `Transformer.forward(batch, kv)` runs one packed batch.
"""
