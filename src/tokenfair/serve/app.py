"""The HTTP layer shared by ``serve`` (engine) and ``gateway`` (proxy) modes.

    client --HTTP--> app (auth, validation, OpenAI framing) --> Service.submit --> Job events
                                                                 (EngineBackend | Gateway)

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming and not),
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
import itertools
import json
import math
import re
import threading
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..contract import Contract
from ..intake import make_request
from ..metrics import entitled_shares, request_record
from ..request import Request, Status
from ..workload import TraceRow
from .auth import AuthError, KeyRing
from .metrics import ServiceMetrics, reason_code
from .openai_schema import (SSE_DONE, ChatCompletionRequest, CompletionRequest, ModelCard, ModelList,
                            error_body, full_response, now_s, sse, stream_chunk, usage_chunk)

# ----------------------------------------------------------------- errors
REJECT_STATUS = {"queue_full": 429, "overloaded": 429, "rate_limited": 429, "class_not_allowed": 403,
                 "context_length_exceeded": 413, "prompt_exceeds_kv_capacity": 413,
                 "shutting_down": 503, "no_backend": 503, "model_not_found": 404}
FAIL_STATUS = {"shutdown": 503, "unschedulable": 503, "no_backend": 503, "client_disconnected": 499,
               "backend_error": 502, "backend_status": 502, "backend_unavailable": 503}


class ServiceError(Exception):
    """A refusal with an HTTP status, an OpenAI error body and headers."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.code, self.param),
                            status_code=self.status, headers=self.headers)


def http_status_of(req: Request) -> int:
    """The HTTP status a terminal request maps to (200 for a finished one)."""
    code = reason_code(req.reason)
    if req.status is Status.FINISHED:
        return 200
    if req.status is Status.EXPIRED:
        return 504
    if req.status is Status.REJECTED:
        return REJECT_STATUS.get(code, 429)
    return FAIL_STATUS.get(code, 500)


# ----------------------------------------------------------------- events
@dataclass(slots=True)
class Delta:
    text: str
    tokens: int = 1


@dataclass(slots=True)
class Done:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True)
class Failed:
    status: int
    message: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)

    def error(self) -> ServiceError:
        return ServiceError(self.status, self.message, self.code, headers=self.headers)


def failed_event(req: Request) -> Failed:
    status = http_status_of(req)
    headers = {"retry-after": "1"} if status in (503,) else {}
    return Failed(status, f"request {req.status.value}: {req.reason}", reason_code(req.reason), headers)


# ----------------------------------------------------------------- requests
@dataclass
class GenRequest:
    """One validated, authenticated generation request."""

    kind: str                         # "chat" | "completion"
    request_id: str
    tenant: str
    body: ChatCompletionRequest | CompletionRequest
    raw: dict
    klass: str | None = None
    deadline_s: float | None = None
    priority: float | None = None
    forward_headers: dict[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return self.body.stream

    @property
    def model(self) -> str | None:
        return self.body.model


class Job:
    """A submitted request as the HTTP layer sees it: an async stream of events."""

    def __init__(self, g: GenRequest, req: Request) -> None:
        self.g = g
        self.req = req
        self.model = g.model or ""
        self.finished = asyncio.Event()

    async def next_event(self) -> Delta | Done | Failed:
        raise NotImplementedError

    async def collect(self) -> tuple[str, Done | Failed]:
        parts = []
        while True:
            ev = await self.next_event()
            if isinstance(ev, Delta):
                parts.append(ev.text)
            else:
                return "".join(parts), ev


class RecordSink:
    """Terminal request records: the last ``keep`` in memory, all appended to ``path``."""

    def __init__(self, path: str | Path | None = None, keep: int = 100_000) -> None:
        self.items: deque[dict] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._fh = None
        if path is not None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._fh = p.open("a")

    def add(self, rec: dict) -> None:
        line = json.dumps(rec)
        with self._lock:
            self.items.append(rec)
            if self._fh is not None:
                self._fh.write(line + "\n")
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


# ----------------------------------------------------------------- service base
class Service:
    """What both modes share: contract intake, door checks, records, metrics, shutdown state.

    Subclasses implement ``submit``, ``cancel``, ``start``, ``stop``, ``drain``,
    ``model_names``, ``health`` and ``snapshot``; they own ``policy`` (a scheduling policy
    bound to the contract) and ``policy_lock`` (held while touching it from the HTTP side)."""

    mode = "base"

    def __init__(self, contract: Contract, keyring: KeyRing, *, records: RecordSink | None = None,
                 max_tenant_labels: int = 20) -> None:
        self.contract = contract
        self.keyring = keyring
        self.records = records or RecordSink()
        self.metrics = ServiceMetrics(contract, max_tenant_labels, self.snapshot)
        self._t0 = time.perf_counter()
        self._seq = itertools.count()
        self.closing = False
        self.policy = None
        self.policy_lock: Any = nullcontext()

    # -- clock & ids
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def next_seq(self) -> int:
        return next(self._seq)

    # -- contract intake
    def intake(self, g: GenRequest, prompt_tokens: int, max_tokens: int, now: float) -> Request:
        """The scheduler request for ``g`` (class, priority, deadline from the contract)."""
        row = TraceRow(request_id=g.request_id, arrival_s=now, tenant=g.tenant, prompt_tokens=max(1, prompt_tokens),
                       output_tokens=1, klass=g.klass, deadline_s=g.deadline_s, priority=g.priority,
                       max_tokens=max_tokens)
        req, reject = make_request(row, self.next_seq(), self.contract)
        if reject is not None:
            raise self.refuse(req, reject, now, endpoint=g.kind)
        return req

    def refuse(self, req: Request, reason: str, now: float, retry_after: float | None = None,
               endpoint: str | None = None) -> ServiceError:
        """End ``req`` as REJECTED with ``reason`` (recorded once) and build its HTTP error."""
        if not req.status.is_terminal:
            req.status, req.reason, req.finish_s = Status.REJECTED, reason, now
        self.metrics.rejected(req.tenant, req.reason)
        self.record(req, endpoint=endpoint)
        return self.rejection_error(req, retry_after)

    def rejection_error(self, req: Request, retry_after: float | None = None) -> ServiceError:
        status = http_status_of(req)
        code = reason_code(req.reason)
        headers: dict[str, str] = {}
        if status == 429:
            headers = self.ratelimit_headers(req.tenant, retry_after if retry_after is not None
                                             else _retry_hint(req.reason))
        elif status == 503:
            headers = {"retry-after": str(max(1, math.ceil(retry_after or 1)))}
        return ServiceError(status, req.reason, code, headers=headers)

    def ratelimit_headers(self, tenant: str, retry_after: float) -> dict[str, str]:
        """``Retry-After`` and ``x-ratelimit-*``: requests = the tenant's queue (max_queued),
        tokens = its token bucket in cost units (only when the contract gives it a rate limit)."""
        spec = self.contract.tenant(tenant)
        retry = max(1, math.ceil(retry_after))
        with self.policy_lock:
            t = getattr(self.policy, "tenants", {}).get(tenant)
            waiting = t.num_waiting if t is not None else 0
            bucket = None
            if spec.rate_limit is not None and t is not None:
                adm = getattr(self.policy, "admission", None)
                if adm is not None:
                    adm.refill(t, self.now())
                bucket = t.bucket
        h = {"retry-after": str(retry),
             "x-ratelimit-limit-requests": str(spec.max_queued),
             "x-ratelimit-remaining-requests": str(max(0, spec.max_queued - waiting)),
             "x-ratelimit-reset-requests": f"{retry}s"}
        rl = spec.rate_limit
        if rl is not None:
            b = rl.burst_tokens if bucket is None else bucket
            h["x-ratelimit-limit-tokens"] = str(int(rl.burst_tokens))
            h["x-ratelimit-remaining-tokens"] = str(max(0, int(b)))
            h["x-ratelimit-reset-tokens"] = f"{max(0.0, (rl.burst_tokens - b) / rl.tokens_per_s):.3f}s"
        return h

    def door_check(self, req: Request, now: float) -> tuple[str, float] | None:
        """A token-rate-limited tenant whose bucket cannot admit ``req`` within its class's
        max wait is refused now (``rate_limited``) rather than left to starve in the queue.
        Call with ``policy_lock`` held.  Returns (reason, retry_after_s) or None."""
        spec = self.contract.tenant(req.tenant)
        rl = spec.rate_limit
        tenants = getattr(self.policy, "tenants", None)
        if rl is None or tenants is None or req.max_wait_s is None or not self.contract.admission.shed_over_max_wait:
            return None
        t = self.policy.tenant(req.tenant, now)
        self.policy.admission.refill(t, now)
        qc = t.queued_cost                       # a float, or per class in newer policies
        queued = sum(qc.values()) if isinstance(qc, dict) else float(qc)
        wait = max(0.0, queued - t.bucket) / rl.tokens_per_s
        limit = self.contract.admission.shed_margin * req.max_wait_s
        if wait <= limit:
            return None
        return (f"rate_limited: tenant {req.tenant!r} token rate limit ({rl.tokens_per_s:g}/s) admits this "
                f"request in ~{wait:.1f}s > {limit:.1f}s (class {req.klass!r}); retry after ~{wait - limit:.0f}s",
                wait - limit)

    # -- terminal bookkeeping
    def record(self, req: Request, endpoint: str | None = None, finish_reason: str | None = None,
               **extra: Any) -> None:
        rec = request_record(req)
        rec.update({"mode": self.mode, "endpoint": endpoint, "http_status": http_status_of(req),
                    "finish_reason": finish_reason}, **extra)
        self.records.add(rec)
        if req.status is not Status.REJECTED:
            self.metrics.ended(req)
        else:
            self.metrics.requests.labels(self.metrics.tenant(req.tenant), self.metrics.klass(req.klass),
                                         "rejected").inc()

    def share_snapshot(self, now: float) -> tuple[dict, dict]:
        """(recent service share, entitled share) per active tenant of a fair policy."""
        pol = self.policy
        tenants = getattr(pol, "tenants", None)
        if not tenants:
            return {}, {}
        tau = getattr(pol, "share_tau_s", 10.0)
        recent = {n: t.decayed_recent(now, tau) for n, t in tenants.items()}
        total = sum(recent.values())
        share = {n: (v / total if total > 0 else 0.0) for n, v in recent.items()}
        active = [n for n, t in tenants.items() if t.num_waiting or t.running]
        ent = entitled_shares({n: tenants[n].weight for n in active},
                              {n: tenants[n].spec.min_share for n in active}) if active else {}
        return share, {n: ent.get(n, 0.0) for n in tenants}

    # -- to implement
    def model_names(self) -> list[str]:
        raise NotImplementedError

    def submit(self, g: GenRequest) -> Job:
        raise NotImplementedError

    def cancel(self, job: Job, reason: str = "client_disconnected: the client closed the connection") -> None:
        raise NotImplementedError

    def health(self) -> tuple[bool, dict]:
        return (not self.closing), {"mode": self.mode, "closing": self.closing}

    def snapshot(self) -> dict:
        return {}

    async def start(self) -> None:
        pass

    def begin_shutdown(self) -> None:
        """Stop accepting: new requests get 503 ``shutting_down``."""
        self.closing = True

    async def drain(self, grace_s: float) -> None:
        """Let accepted requests finish for up to ``grace_s``; then fail the rest ("shutdown")."""

    async def stop(self) -> None:
        self.records.close()


def _retry_hint(reason: str) -> float:
    m = re.search(r"retry after ~?([0-9.]+)s", reason)
    return float(m.group(1)) if m else 1.0


# ----------------------------------------------------------------- parsing helpers
def _header_float(headers, name: str) -> float | None:
    raw = headers.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ServiceError(400, f"header {name}: expected a number, got {raw!r}", "invalid_header", name) from None
    if not math.isfinite(v):
        raise ServiceError(400, f"header {name}: must be finite", "invalid_header", name)
    return v


def build_gen_request(kind: str, body, raw: dict, headers, tenant: str) -> GenRequest:
    ext = body.tokenfair
    klass = headers.get("x-tokenfair-class") or (ext.klass if ext else None)
    deadline = _header_float(headers, "x-tokenfair-deadline-s")
    if deadline is None and ext is not None:
        deadline = ext.deadline_s
    if deadline is not None and deadline <= 0:
        raise ServiceError(400, "x-tokenfair-deadline-s: must be > 0 seconds", "invalid_header", "x-tokenfair-deadline-s")
    priority = _header_float(headers, "x-tokenfair-priority")
    if priority is None and ext is not None:
        priority = ext.priority
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    fwd = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key")
           or k.lower().startswith("x-tokenfair-")}
    return GenRequest(kind, prefix + uuid.uuid4().hex[:24], tenant, body, raw, klass=klass or None,
                      deadline_s=deadline, priority=priority, forward_headers=fwd)


_UNION_MARK = re.compile(r"str|int|float|bool|dict|list|none|(list|dict|tuple|set|literal)\[.*\]|function-.*|"
                         r"lax-or-strict.*|json-or-python.*|constrained-.*")


def _validation_message(errors) -> tuple[str, str | None]:
    parts, first = [], None
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        # drop pydantic's union-branch markers ("str", "list[int]", "function-after[...]")
        loc = [p for p in loc if not _UNION_MARK.fullmatch(p)]
        path = ".".join(loc) or "(body)"
        first = first or path
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        if e.get("type") == "json_invalid":
            msg = "body is not valid JSON"
            path = "(body)"
        parts.append(f"{path}: {msg}")
    return "; ".join(dict.fromkeys(parts)), (None if first == "(body)" else first)


# ----------------------------------------------------------------- streaming response
class EventStream(StreamingResponse):
    """SSE response that watches for client disconnects itself (whatever the ASGI spec
    version) and always calls ``on_close`` once the stream ends, however it ends."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(chunks, status_code=200, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})
        self.chunks = chunks
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        async def pump() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def listen() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return

        tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(listen())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self.chunks.aclose()
            except Exception:  # noqa: BLE001
                pass
            self.on_close()


async def _disconnected(request: HTTPRequest) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _race(coro, watcher: asyncio.Future):
    """Result of ``coro``, or None if ``watcher`` (client disconnect) finishes first."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    return None


# ----------------------------------------------------------------- the app
def create_app(service: Service, grace_s: float = 30.0) -> FastAPI:
    """FastAPI app over ``service``; the lifespan starts it and, on shutdown, drains it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            if not service.closing:
                service.begin_shutdown()
            await service.drain(grace_s)
            await service.stop()

    app = FastAPI(title=f"tokenfair {service.mode}", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, exc: RequestValidationError):
        msg, param = _validation_message(exc.errors())
        return JSONResponse(error_body(400, msg, "invalid_request", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(ServiceError)
    async def _service_error(request, exc: ServiceError):
        return exc.response()

    def authenticate(request: HTTPRequest) -> str:
        try:
            return service.keyring.tenant_for(request.headers.get("authorization"), request.headers.get("x-api-key"))
        except AuthError as err:
            raise ServiceError(401, err.message, "invalid_api_key",
                               headers={"www-authenticate": "Bearer"}) from None

    async def parse(request: HTTPRequest, model_cls):
        tenant = authenticate(request)
        raw_bytes = await request.body()
        try:
            raw = json.loads(raw_bytes or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ServiceError(400, "body is not valid JSON", "invalid_json") from None
        if not isinstance(raw, dict):
            raise ServiceError(400, "body must be a JSON object", "invalid_request")
        try:
            body = model_cls.model_validate(raw)
        except Exception as err:  # pydantic.ValidationError
            errors = getattr(err, "errors", None)
            if errors is None:
                raise
            msg, param = _validation_message(err.errors())
            raise ServiceError(400, msg, "invalid_request", param) from None
        return tenant, body, raw

    async def generate(request: HTTPRequest, kind: str, model_cls) -> Response:
        tenant, body, raw = await parse(request, model_cls)
        g = build_gen_request(kind, body, raw, request.headers, tenant)
        job = service.submit(g)        # ServiceError -> handler
        headers = {"x-request-id": g.request_id, "x-tokenfair-tenant": tenant, "x-tokenfair-class": job.req.klass}
        watcher = asyncio.ensure_future(_disconnected(request))
        streaming = False
        try:
            if not g.stream:
                res = await _race(job.collect(), watcher)
                if res is None:
                    service.cancel(job)
                    return Response(status_code=499)
                text, end = res
                if isinstance(end, Failed):
                    return JSONResponse(error_body(end.status, end.message, end.code), status_code=end.status,
                                        headers={**end.headers, **headers})
                return JSONResponse(full_response(kind, g.request_id, job.model, text, end.finish_reason,
                                                  end.prompt_tokens, end.completion_tokens), headers=headers)
            first = await _race(job.next_event(), watcher)
            if first is None:
                service.cancel(job)
                return Response(status_code=499)
            if isinstance(first, Failed):
                return JSONResponse(error_body(first.status, first.message, first.code), status_code=first.status,
                                    headers={**first.headers, **headers})
            streaming = True
            watcher.cancel()
            return EventStream(_sse(job, first, kind, g), lambda: service.cancel(job), headers)
        finally:
            if not streaming:
                watcher.cancel()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await generate(request, "chat", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await generate(request, "completion", CompletionRequest)

    @app.get("/v1/models")
    async def models(request: HTTPRequest):
        authenticate(request)
        created = now_s()
        return ModelList(data=[ModelCard(id=m, created=created) for m in service.model_names()]).model_dump()

    @app.get("/healthz")
    async def healthz():
        ok, info = service.health()
        return JSONResponse({"status": "ok" if ok else "unavailable", **info}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


async def _sse(job: Job, first, kind: str, g: GenRequest) -> AsyncIterator[bytes]:
    created = now_s()
    rid, model = g.request_id, job.model
    if kind == "chat":
        yield sse(stream_chunk(kind, rid, model, created, text="", role=True))
    ev = first
    while True:
        if isinstance(ev, Delta):
            if ev.text:
                yield sse(stream_chunk(kind, rid, model, created, text=ev.text))
        elif isinstance(ev, Done):
            yield sse(stream_chunk(kind, rid, model, created, text="" if kind == "completion" else None,
                                   finish_reason=ev.finish_reason))
            if g.body.include_usage:
                yield sse(usage_chunk(kind, rid, model, created, ev.prompt_tokens, ev.completion_tokens))
            yield SSE_DONE
            return
        else:
            yield sse(error_body(ev.status, ev.message, ev.code))
            yield SSE_DONE
            return
        ev = await job.next_event()
