"""The server says it is ready only after one warm-up request ran through the engine (grammar backend
built, the forward called), so the first client does not pay for them, and the warm-up left nothing held."""
from __future__ import annotations

from live import PLAIN, LiveServer, assert_all_free


def test_ready_means_warm_and_the_warm_up_left_nothing(tiny) -> None:
    with LiveServer(tiny, PLAIN) as srv:
        metrics = srv.call(srv.engine.metrics)
        assert metrics.steps >= 1 and metrics.output_tokens >= 1      # before any client asked
        assert_all_free(srv.wait_idle(), PLAIN.max_batch_size)
