"""`create_app(engine, config)`: the FastAPI app over one Engine.

The engine is entered in the app's lifespan (one task enters and leaves it, as its task group
requires) and closed when the server stops.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from prometheus_client import CONTENT_TYPE_LATEST

from interlock.engine import Engine
from interlock.protocol.grammar import Choice
from interlock.protocol.sampling import Delta, SamplingParams
from interlock.server.admission import Admission
from interlock.server.config import ServerConfig
from interlock.server.errors import APIError, body_error
from interlock.server.logprobs import TokenTexts
from interlock.server.generation import (
    ClientGone, ShuttingDown, check_finished, collect_all, open_runs, unless_stopped, wait_disconnect,
)
from interlock.server.metrics import ServerMetrics
from interlock.server.middleware import BodyLimit, BodyTooLarge, Outcomes
from interlock.server.responses import (
    ChatCompletion, ChatCompletionChunk, ModelCard, ModelList, TextCompletion, Usage,
)
from interlock.server.schemas import ChatCompletionRequest, CompletionRequest
from interlock.server.shaping import ChoiceShaper
from interlock.server.sse import SSEResponse
from interlock.server.translate import EngineFacts, Plan, plan_chat, plan_completion
from interlock.logs import get_logger

log = get_logger(__name__)
CLIENT_CLOSED = 499     # nginx's code for "client closed the request"; the client never sees it


class Server:
    """The state one app closes over: engine, config, admission, metrics (no globals)."""

    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine, self.config = engine, config
        spec = engine.config.speculative
        self.facts = EngineFacts(speculative=spec is not None, grammar_backend=engine.config.grammar.backend,
                                 reasoning_markers=engine.tokenizer.reasoning_markers or ("<think>", "</think>"))
        self.metrics = ServerMetrics(spec.label if spec is not None else "none")
        self.admission = Admission(engine.config.max_batch_size + config.max_queue, config.retry_after_s)
        self.created = int(time.time())
        self.texts = TokenTexts(engine.tokenizer)             # token strings and bytes, for logprobs
        self.loop: asyncio.AbstractEventLoop | None = None    # the engine's loop (tests call into it)
        self._stopping: anyio.Event | None = None
        self.clock: Callable[[], float] = time.monotonic
        self._stop_at: float | None = None      # the drain deadline, on `clock`

    def begin_shutdown(self) -> None:
        """Stop admitting; requests in flight get `shutdown_timeout_s` to finish (see drain_deadline)."""
        self.admission.draining = True
        if self._stop_at is None:           # a second signal keeps the first deadline
            self._stop_at = self.clock() + self.config.shutdown_timeout_s
        if self._stopping is not None:
            self._stopping.set()

    def drain_left(self) -> float | None:
        """Seconds until the drain deadline (0 once it passed); None before shutdown began."""
        return None if self._stop_at is None else max(0.0, self._stop_at - self.clock())

    async def drain_deadline(self) -> None:
        """Returns `shutdown_timeout_s` after shutdown began, counted from the signal: a request that
        starts during the drain gets what is left, not a timeout of its own. Then it is cut off."""
        assert self._stopping is not None
        await self._stopping.wait()
        await anyio.sleep(self.drain_left() or 0.0)

    def check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.config.model_name!r}",
                           param="model", code="model_not_found")

    async def respond(self, request: Request, plan: Plan, *, chat: bool, t0: float) -> Response:
        ticket = self.admission.acquire(len(plan.calls))
        gone = lambda: wait_disconnect(request.receive)        # noqa: E731
        try:
            runs = await unless_stopped(lambda: open_runs(self.engine, plan, t0, self.metrics),
                                        gone, self.drain_deadline)
        except BaseException as exc:
            ticket.release()
            return self._stopped(exc)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        texts = self.texts if plan.calls[0].sampling.logprobs is not None else None
        shapers = [ChoiceShaper(i, chat=chat, tools=plan.tools, auto_tools=plan.auto_tools,
                                reasoning=plan.reasoning, texts=texts) for i in range(len(runs))]
        if plan.stream:
            return SSEResponse(runs, shapers, chunk_encoder(chat, rid, self.config.model_name),
                               Usage.of if plan.include_usage else None, plan.grammar_param,
                               on_close=ticket.release, deadline=self.drain_deadline)
        try:
            results = await unless_stopped(lambda: collect_all(runs, plan.grammar_param), gone, self.drain_deadline)
        except BaseException as exc:
            return self._stopped(exc)
        finally:
            ticket.release()
        return JSONResponse(full_body(chat, rid, self.config.model_name, shapers, results))

    @staticmethod
    def _stopped(exc: BaseException) -> Response:
        """The answer when the client left (nobody reads it) or the drain deadline passed; else re-raise."""
        if isinstance(exc, ClientGone):
            return Response(status_code=CLIENT_CLOSED)
        if isinstance(exc, ShuttingDown):
            return APIError(503, "the server shut down before the request finished", code="shutting_down").response()
        raise exc

    async def healthy(self) -> str | None:
        """None when the engine answers; else why not."""
        try:
            with anyio.fail_after(self.config.health_timeout_s):
                await self.engine.resources()
        except Exception as exc:        # closed, failed, or not started: all mean "do not send traffic"
            return f"{type(exc).__name__}: {exc}"
        return None


async def warm_up(engine: Engine) -> None:
    """One two-token constrained request before the server says it is ready: the grammar backend's
    vocabulary tables and the forward's first calls are paid here, not by the first client (whose
    request took ~10 s on the embedded model before)."""
    ids = engine.tokenizer.encode("Hi") or [0]
    await engine.complete(ids, grammar=Choice(["yes", "no"]), sampling=SamplingParams(temperature=0.0, max_tokens=2))


def chunk_encoder(chat: bool, rid: str, model: str) -> Callable[[list[Any], Usage | None], bytes]:
    """The `data:` event for some chunk choices (or none and the usage, at the end of a stream)."""
    created, cls = int(time.time()), ChatCompletionChunk if chat else TextCompletion

    def encode(choices: list[Any], usage: Usage | None) -> bytes:
        body = cls(id=rid, created=created, model=model, choices=choices, usage=usage)
        return b"data: " + body.model_dump_json().encode() + b"\n\n"

    return encode


def full_body(chat: bool, rid: str, model: str, shapers: list[ChoiceShaper], results: list[list[Delta]]) -> dict:
    """A non-streamed answer: each choice's whole text through its shaper, and the usage of all."""
    choices: list[Any] = []         # ChatChoices from a chat request's shapers, TextChoices from a text one's
    stats = []
    for shaper, deltas in zip(shapers, results):
        text, last = check_finished(deltas)
        shaper.piece(text, [lp for d in deltas for lp in d.logprobs or ()])
        assert last.finish_reason is not None and last.stats is not None    # check_finished made sure
        choices.append(shaper.full(last.finish_reason))
        stats.append(last.stats)
    cls = ChatCompletion if chat else TextCompletion
    body = cls(id=rid, created=int(time.time()), model=model, choices=choices, usage=Usage.of(stats))
    return body.model_dump(mode="json")


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return body_error(exc.errors()).response()


def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (unknown path, wrong method, unreadable body) in OpenAI's shape."""
    if isinstance(exc.__cause__, BodyTooLarge):     # FastAPI reports any body-read error as a 400
        return APIError(413, "request body too large", code="body_too_large").response()
    return APIError(exc.status_code, str(exc.detail)).response()


def create_app(engine: Engine, config: ServerConfig = ServerConfig()) -> FastAPI:
    """The app; run it with uvicorn (see server/run.py). The engine must not be entered yet."""
    server = Server(engine, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.loop = asyncio.get_running_loop()
        server._stopping = anyio.Event()
        async with engine:
            await warm_up(engine)
            log.info("server_ready", model=config.model_name)
            yield
            server.admission.draining = True
        log.info("engine_closed")

    async def authorized(request: Request) -> None:
        if config.api_key is not None and request.headers.get("authorization") != f"Bearer {config.api_key}":
            raise APIError(401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key")

    app = FastAPI(title="interlock", lifespan=lifespan)
    app.state.server = server
    app.add_exception_handler(APIError, lambda request, exc: exc.response())
    app.add_exception_handler(RequestValidationError, validation_error)        # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)                       # type: ignore[arg-type]
    app.add_exception_handler(Exception, lambda request, exc: APIError(
        500, f"internal error: {type(exc).__name__}", code="internal_error").response())

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        t0 = time.perf_counter()
        server.check_model(body.model)
        return await server.respond(request, plan_chat(body, server.facts, config), chat=True, t0=t0)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request, body: CompletionRequest) -> Response:
        t0 = time.perf_counter()
        server.check_model(body.model)
        return await server.respond(request, plan_completion(body, server.facts, config), chat=False, t0=t0)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=config.model_name, created=server.created)]).model_dump()

    @app.get("/health")
    async def health() -> Response:
        why = await server.healthy()
        if why is not None:
            return APIError(503, f"unhealthy: {why}", code="unhealthy").response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            resources = await server.engine.resources()
        except Exception:               # keep serving the counters even when the engine is gone
            resources = None
        if resources is not None:
            server.metrics.engine_state(resources, server.admission.in_flight, engine.config.max_batch_size)
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # The last added is the outermost: Outcomes counts every answer, BodyLimit's 413s included.
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)    # before anything reads the body
    app.add_middleware(Outcomes, metrics=server.metrics)
    return app
