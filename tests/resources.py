"""What "nothing leaked" means, in one place: every per-request counter `Engine.resources()` reports
is 0 and every pool is back to its total. The engine and the server tests both check it."""
from __future__ import annotations

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
