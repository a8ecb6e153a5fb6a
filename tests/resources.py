"""What tests share about an engine's resources. What "nothing leaked" means, in one place: every
per-request counter `Engine.resources()` reports is 0 and every pool is back to its total (the engine
and the server tests both check it). And the context the device runner's tests run at."""
from __future__ import annotations

# max_context of the device runner's tests (EngineConfig.max_context). On the CPU its attention
# attends over every slot a table can address (models/reference_ops.py): at the tiny preset's 4096
# that was over half of each device test's time. Their prompts and outputs fit in 256 (~100 tokens
# at most): no request reaches the limit, and the laws compare runs of the same context.
DEVICE_CONTEXT = 256

PER_REQUEST = ("kv_sequences", "matchers", "ngram_requests", "suffix_requests", "suffix_request_nodes",
               "adaptive_budgets", "user_contexts",
               "draft_requests", "draft_generators", "verify_generators", "penalty_entries", "conditional_walks",
               "compiled_grammars",
               "output_streams", "engine_streams", "requests")


def leaks(res: dict[str, int], max_batch_size: int) -> list[str]:
    """The names of what is still held (empty when everything is free)."""
    held = [name for name in PER_REQUEST if res.get(name, 1) != 0]
    if res["kv_free_blocks"] != res["kv_total_blocks"]:
        held.append("kv_blocks")
    if res["draft_kv_free_blocks"] != res["draft_kv_total_blocks"]:
        held.append("draft_kv_blocks")
    if res["slots_free"] != max_batch_size:
        held.append("slots")
    return held
