"""Prometheus metrics of one server (its own registry: no process-global state).

Per request: outcomes, tokens in/out, TTFT, inter-token latency (between streamed deltas; a
speculative step may bring several tokens at once), acceptance length per drafter, exposed
grammar time. Engine gauges (queue depth, running, KV blocks) are read when /metrics is scraped.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from interlock.protocol.sampling import RequestStats

OUTCOMES = ("ok", "cancelled", "bad_request", "rejected", "error")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self, drafter: str) -> None:
        self.drafter = drafter
        r = self.registry = CollectorRegistry()
        self.requests = Counter("interlock_requests", "HTTP requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.prompt_tokens = Counter("interlock_prompt_tokens", "prompt tokens of finished choices", registry=r)
        self.generation_tokens = Counter("interlock_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("interlock_time_to_first_token_seconds", "request arrival -> first token",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("interlock_inter_token_latency_seconds", "time between a choice's deltas",
                             buckets=_LATENCY, registry=r)
        self.acceptance = Histogram("interlock_acceptance_length", "tokens per verify step of a finished choice",
                                    ["drafter"], buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 8, 17), registry=r)
        self.exposed_grammar = Counter("interlock_exposed_grammar_seconds",
                                       "time the model lane waited for grammar masks", registry=r)
        self.queue_depth = Gauge("interlock_queue_depth", "admitted choices not yet running", registry=r)
        self.running = Gauge("interlock_running_requests", "choices holding a batch slot", registry=r)
        self.in_flight = Gauge("interlock_admitted_requests", "choices admitted and not finished", registry=r)
        self.kv_used = Gauge("interlock_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_total = Gauge("interlock_kv_blocks_total", "KV cache blocks in the pool", registry=r)
        for endpoint in ("chat", "completions"):
            for outcome in OUTCOMES:
                self.requests.labels(endpoint, outcome)

    def finished(self, stats: RequestStats) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.output_tokens)
        self.exposed_grammar.inc(stats.exposed_grammar_ms / 1e3)
        if stats.steps:
            self.acceptance.labels(self.drafter).observe(stats.mean_acceptance_length)

    def engine_state(self, resources: dict[str, int], admitted: int, max_batch_size: int) -> None:
        running = max_batch_size - resources["slots_free"]
        self.running.set(running)
        self.in_flight.set(admitted)
        self.queue_depth.set(max(0, admitted - running))
        self.kv_total.set(resources["kv_total_blocks"])
        self.kv_used.set(resources["kv_total_blocks"] - resources["kv_free_blocks"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
