"""Replicas of the OpenAI server on Ray Serve: N replicas, each its own process, Engine and app.

    interlock serve --model tiny --replicas 2              # a local Ray instance, Serve on --port
    serve run interlock.server.ray_serve:app_builder model=tiny replicas=2    # Ray's own CLI

Each replica builds its Engine in its constructor and the app of server/app.py around it (so the
HTTP surface, errors and drain are the single-process server's); Ray Serve's proxy spreads requests
over the replicas and restarts a replica whose process dies. Wired to Ray:
- health: Ray calls `check_health` every `health_check_period_s`; it raises while the engine does
  not answer (closed, crashed), and Ray replaces the replica;
- drain: on scale-down or shutdown Ray stops routing to the replica, waits up to
  `graceful_shutdown_timeout_s` for its requests, then runs the app's lifespan exit (engine close);
- backpressure: `max_ongoing_requests` = the engine's batch + the server's queue; past it Ray
  queues at the proxy, then answers 503;
- autoscaling: with `max_replicas > min_replicas` Ray scales on ongoing requests per replica
  (target: the engine's batch size).
Every response carries `x-interlock-replica` (the replica id) and `x-interlock-pid`.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from interlock.logs import get_logger
from interlock.server.config import ServerConfig

log = get_logger(__name__)
DEPLOYMENT = "interlock"


@dataclass(frozen=True)
class ReplicaConfig:
    """How many replicas and how Ray treats them (validated here, never mutated)."""

    min_replicas: int = 1
    max_replicas: int = 1                   # > min_replicas: autoscaling between the two
    cpus_per_replica: float = 1.0
    health_check_period_s: float = 5.0
    health_check_timeout_s: float = 10.0
    graceful_shutdown_timeout_s: float = 10.0
    engine_options: dict[str, Any] = field(default_factory=dict)   # Engine.from_pretrained keywords

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.cpus_per_replica <= 0 or self.health_check_period_s <= 0 or self.health_check_timeout_s <= 0:
            raise ValueError("cpus_per_replica and the health-check times must be positive")

    @classmethod
    def fixed(cls, n: int, **options: Any) -> ReplicaConfig:
        return cls(min_replicas=n, max_replicas=n, **options)


class EngineReplica:
    """One replica: an Engine and the OpenAI app over it (Ray Serve calls the methods)."""

    def __init__(self, model: str, server: ServerConfig, engine_options: dict[str, Any]) -> None:
        from interlock.engine import Engine

        self.engine = Engine.from_pretrained(model, **engine_options)
        self.server_config = server
        self.openai_app: Any = None

    def __serve_build_asgi_app__(self) -> Any:
        from ray import serve

        from interlock.server.app import create_app

        self.openai_app = create_app(self.engine, self.server_config)
        replica = serve.get_replica_context().replica_id.unique_id
        return ReplicaHeaders(self.openai_app, replica)

    async def check_health(self) -> None:
        """Raises while the engine does not answer, so that Ray replaces this replica."""
        app = self.openai_app
        why = await app.state.server.healthy() if app is not None else "no app yet"
        if why is not None:
            raise RuntimeError(f"engine unhealthy: {why}")


class ReplicaHeaders:
    """ASGI wrapper adding which replica (and process) answered: for tests, logs and debugging."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app = app
        self.headers = [(b"x-interlock-replica", replica.encode()), (b"x-interlock-pid", str(os.getpid()).encode())]

    def __getattr__(self, name: str) -> Any:     # Ray looks for FastAPI's add_exception_handler, docs_url
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_app(model: str, server: ServerConfig = ServerConfig(), replicas: ReplicaConfig = ReplicaConfig()) -> Any:
    """The Serve application (pass it to `serve.run`)."""
    from ray import serve

    engine = replicas.engine_options
    batch = int(engine.get("max_batch_size", 8))
    options: dict[str, Any] = dict(
        name=DEPLOYMENT,
        ray_actor_options={"num_cpus": replicas.cpus_per_replica},
        max_ongoing_requests=batch + server.max_queue,
        health_check_period_s=replicas.health_check_period_s,
        health_check_timeout_s=replicas.health_check_timeout_s,
        graceful_shutdown_timeout_s=replicas.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=0.5,
    )
    if replicas.max_replicas > replicas.min_replicas:
        options["autoscaling_config"] = {"min_replicas": replicas.min_replicas, "max_replicas": replicas.max_replicas,
                                         "target_ongoing_requests": batch}
    else:
        options["num_replicas"] = replicas.min_replicas
    deployment = serve.deployment(**options)(serve.ingress()(EngineReplica))
    return deployment.bind(model, server, engine)


# Engine.from_pretrained keywords Ray's CLI may set (`key=value`), with their types: the same names
# as the engine options `interlock serve` builds (cli.engine_options).
ENGINE_OPTIONS: dict[str, type] = {"speculative": str, "draft_len": int, "grammar_backend": str, "max_batch_size": int,
                                   "tensor_parallel": int, "threads": int, "prefill": str, "kv_dtype": str,
                                   "device": str, "weights": str}


def app_builder(args: dict[str, str]) -> Any:
    """For Ray's CLI: `serve run interlock.server.ray_serve:app_builder model=tiny replicas=2
    [max_replicas=4] [speculative=ngram+forced] [max_batch_size=8] [kv_dtype=float16] [api_key=...]`
    (every key of ENGINE_OPTIONS is passed to the replicas' engines)."""
    model = args.get("model", ServerConfig.model_name)
    n = int(args.get("replicas", 1))
    engine = {key: kind(args[key]) for key, kind in ENGINE_OPTIONS.items() if key in args}
    replicas = ReplicaConfig(min_replicas=n, max_replicas=int(args.get("max_replicas", n)),
                             cpus_per_replica=float(args.get("cpus_per_replica", 1.0)), engine_options=engine)
    return build_app(model, ServerConfig(model_name=args.get("model_name", model), api_key=args.get("api_key")),
                     replicas)


def run_replicas(model: str, server: ServerConfig, replicas: ReplicaConfig, num_cpus: int | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
    """`interlock serve --replicas N`: start (or join, when RAY_ADDRESS is set) Ray, run the
    deployment with Serve's proxy on server.host:port, block until SIGINT / SIGTERM, then drain
    (Ray waits `graceful_shutdown_timeout_s` for requests in flight) and shut Serve and Ray down.
    `on_ready` runs once every replica is running (serve.run waits for that)."""
    import signal
    import threading

    import ray
    from ray import serve

    stop = threading.Event()
    ray.init(num_cpus=num_cpus, include_dashboard=False)
    # after ray.init, which installs its own SIGTERM handler (it would kill the driver without a drain)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": server.host, "port": server.port})
        serve.run(build_app(model, server, replicas), name=DEPLOYMENT, route_prefix="/", blocking=False)
        log.info("replicas_ready", model=model, url=f"http://{server.host}:{server.port}/v1",
                 min_replicas=replicas.min_replicas, max_replicas=replicas.max_replicas)
        if on_ready is not None:
            on_ready()
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
