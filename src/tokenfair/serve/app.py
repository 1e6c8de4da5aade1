"""The HTTP layer shared by ``serve`` (engine) and ``gateway`` (proxy) modes.

    client --HTTP--> app (auth, validation, OpenAI framing) --> Service.submit --> Job events
                                                                 (EngineBackend | Gateway)

Routes (:class:`OpenAIRoutes`, :func:`install_ops`; admin routes in :mod:`.admin`): ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming and not),
``GET /v1/models``, ``GET /healthz``, ``GET /metrics``.

Flow of one generation request:
  1. the API key names the tenant (401 otherwise, before the body is looked at);
  2. the body is validated (a malformed body is a 400 naming the field path, never a 422);
  3. ``service.submit`` applies the contract (class, deadline, priority clamped by
     ``intake.make_request``) and the admission checks; refusals raise :class:`ServiceError`
     (429 with ``Retry-After`` and ``x-ratelimit-*`` headers, 403, 413, 503);
  4. the handler waits for the job's first event while watching for a client disconnect;
     a failure before the first token (deadline expiry -> 504, shutdown -> 503, ...) is an
     error response with a proper status; otherwise the response is streamed (SSE) or
     collected.  A client that goes away cancels the job (``service.cancel``), which frees
     its queue slot and KV cache.

Every request that passes authentication and validation ends in exactly one terminal
state with a reason, recorded once (``RecordSink``: ``requests.jsonl``-like lines with the
simulator's fields plus ``endpoint``, ``http_status`` and ``finish_reason``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.reasons import ReasonCode
from .auth import AuthError, KeyRing, hash_key
from .defaults import DEFAULT_GRACE_S
from .errors import ServiceError
from .jobs import Failed, GenRequest, Job
from .openai_schema import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, error_body, full_response, now_s
from .body_precheck import PROCESS_PARSE_BYTES
from .limits import OFFLOAD_PARSE_BYTES, read_body
from .loop_lag import probe_from_env
from .openapi import install_openapi
from .parsing import validation_message, build_gen_request, parse_body
from .service import Service
from .admin import install_admin
from .sse import EventStream, client_disconnected, race, sse_event

# ----------------------------------------------------------------- the app
def create_app(service: Service, grace_s: float = DEFAULT_GRACE_S) -> FastAPI:
    """FastAPI app over ``service``; the lifespan starts it and, on shutdown, drains it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        probe = probe_from_env()        # TOKENFAIR_LOOP_LAG_MS: a diagnostic (loop_lag.py)
        probe_task = asyncio.ensure_future(probe.run()) if probe is not None else None
        try:
            yield
        finally:
            if probe_task is not None:
                probe.stop()
                probe_task.cancel()
            if not service.closing:
                service.begin_shutdown()
            await service.drain(grace_s)
            await service.stop()

    app = FastAPI(title=f"tokenfair {service.mode}", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    install_openapi(app)
    install_admin(app, service)      # /admin/contract*, x-tokenfair-contract, tokenfair_contract_info

    routes = OpenAIRoutes(service)
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await routes.generate(request, "chat", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await routes.generate(request, "completion", CompletionRequest)

    @app.get("/v1/models")
    async def models(request: HTTPRequest):
        routes.authenticate(request)
        created = now_s()
        names = await service.list_models(request.headers)
        return ModelList(data=[ModelCard(id=m, created=created) for m in names]).model_dump()

    install_ops(app, service)
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Errors in OpenAI's shape: a malformed body is a 400 naming the field (never a 422)."""

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, exc: RequestValidationError):
        msg, param = validation_message(exc.errors())
        return JSONResponse(error_body(400, msg, ReasonCode.INVALID_REQUEST, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(ServiceError)
    async def _service_error(request, exc: ServiceError):
        return exc.response()


class OpenAIRoutes:
    """The generation routes' steps: the key names the tenant, the body is read (bounded) and
    validated, the service admits the job, the answer is collected or streamed."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def authenticate(self, request: HTTPRequest) -> str:
        service = self.service
        try:
            return service.keyring.tenant_for(request.headers.get("authorization"), request.headers.get("x-api-key"))
        except AuthError as err:
            service.metrics.unauthorized.labels(request.url.path).inc()
            raise ServiceError(401, err.message, ReasonCode.INVALID_API_KEY,
                               headers={"www-authenticate": "Bearer"}) from None

    async def parse(self, request: HTTPRequest, kind: str, model_cls):
        """(tenant, body, raw, lower bound on the prompt's tokens, kept prompt or None)."""
        service = self.service
        tenant = self.authenticate(request)
        raw_bytes = await read_body(request, service.max_body_bytes)
        bound, kept = 0, None
        if len(raw_bytes) > PROCESS_PARSE_BYTES:      # parsed in a helper process (body_precheck.py)
            verdict = await service.prechecker.check(raw_bytes, kind, *service.prompt_bounds(), tenant=tenant,
                                                     chars_per_token=service.kept_prompt_chars_per_token())
            if verdict is not None:
                bound, kept = verdict.min_prompt_tokens, verdict.kept
                if verdict.reduced is not None:       # its prompt is not needed here (refused, or kept as bytes)
                    raw_bytes = json.dumps(verdict.reduced).encode()
        if len(raw_bytes) > OFFLOAD_PARSE_BYTES:
            body, raw = await run_in_threadpool(parse_body, raw_bytes, model_cls)
        else:
            body, raw = parse_body(raw_bytes, model_cls)
        return tenant, body, raw, bound, kept

    async def generate(self, request: HTTPRequest, kind: str, model_cls) -> Response:
        service = self.service
        tenant, body, raw, bound, kept = await self.parse(request, kind, model_cls)
        g = build_gen_request(kind, body, raw, request.headers, tenant)
        g.kept_prompt = kept
        g.min_prompt_tokens = bound
        await service.prepare(g)       # tokenization/templating, off the event loop
        job = service.submit(g)        # ServiceError -> handler
        headers = {"x-request-id": g.request_id, "x-tokenfair-tenant": tenant, "x-tokenfair-class": job.req.klass}
        watcher = asyncio.ensure_future(client_disconnected(request))
        streaming = False
        try:
            if not g.stream:
                return await self.whole(job, g, kind, watcher, headers)
            first = await race(job.next_event_or_fault(), watcher)
            if first is None:
                service.cancel(job)
                return Response(status_code=499)
            if isinstance(first, Failed):
                if job.fault is not None:
                    service.cancel(job, job.fault)
                return JSONResponse(error_body(first.status, first.message, first.code, first.param),
                                    status_code=first.status,
                                    headers={**first.headers, **headers})
            streaming = True
            watcher.cancel()
            return EventStream(sse_event(job, first, kind, g),
                               lambda: service.cancel(job, job.fault) if job.fault else service.cancel(job), headers)
        finally:
            if not streaming:
                watcher.cancel()

    async def whole(self, job: Job, g: GenRequest, kind: str, watcher, headers: dict) -> Response:
        """A non-streamed answer: collected, or the error; 499 when the client left."""
        service = self.service
        res = await race(job.collect(), watcher)
        if res is None:
            service.cancel(job)
            return Response(status_code=499)
        text, end = res
        if job.fault is not None:
            service.cancel(job, job.fault)
        if isinstance(end, Failed):
            return JSONResponse(error_body(end.status, end.message, end.code, end.param), status_code=end.status,
                                headers={**end.headers, **headers})
        return JSONResponse(full_response(kind, g.request_id, job.model, text, end.finish_reason,
                                          end.prompt_tokens, end.completion_tokens), headers=headers)


def install_ops(app: FastAPI, service: Service) -> None:
    """``GET /healthz`` and ``GET /metrics`` (behind the metrics key when one is set)."""

    @app.get("/healthz")
    async def healthz():
        ok, info = service.health()
        return JSONResponse({"status": "ok" if ok else "unavailable", **info}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: HTTPRequest):
        if service.metrics_key_sha256 is not None:
            key = KeyRing.presented_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
            if key is None or not hmac.compare_digest(hash_key(key), service.metrics_key_sha256):
                service.metrics.unauthorized.labels("/metrics").inc()
                raise ServiceError(401, "/metrics needs the metrics key (--metrics-key-sha256)",
                                   ReasonCode.INVALID_API_KEY,
                                   headers={"www-authenticate": "Bearer"})
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

