"""The gateway's backend client: proxying one released request to a backend (streamed,
re-framed, charged per token) and what a backend's refusal or failure does to it.

:class:`BackendProxy` holds what a proxied call needs and nothing of the gateway: the
timeouts (:class:`~tokenfair.serve.gateway_health.HealthConfig`), the backend key, the
policy's ``on_served`` (per-token charge), the clock, the job book's endings
(:class:`JobEndings`: ``end``, ``requeue_or_fail``) and the prober's signals
(:class:`BackendSignals`: ``mark_down``, ``suspect``).  The HTTP client is passed per call.
"""

from __future__ import annotations

from typing import Callable, Protocol

import httpx

from ..core.reasons import Reason, ReasonCode, backend_finished, from_upstream
from ..core.request import Request, Status
from .sse_read import data_chunks
from .gateway_errors import BackendError, parse_backend_error
from .gateway_health import HealthConfig, timed_lines
from .gateway_jobs import GatewayJob
from .backend_identity import tag_body
from .kept_prompt import body_bytes
from .gateway_window import Backend
from .jobs import Delta, Done, Failed

__all__ = ["BackendProxy", "BackendSignals", "GatewayJob", "JobEndings"]

BACKEND_EWMA_WEIGHT = 0.1       # weight of the newest TTFT / TPOT in a backend's moving average


class JobEndings(Protocol):
    """How a proxied job ends (:class:`~tokenfair.serve.gateway_jobs.JobBook`)."""

    def end(self, job: GatewayJob, status: Status, reason: Reason, event=None, http_status: int | None = None,
            finish_reason: str | None = None) -> None: ...

    def requeue_or_fail(self, job: GatewayJob, b: Backend, reason: Reason, status: int) -> None: ...


class BackendSignals(Protocol):
    """What a proxied call tells the health prober (:class:`~tokenfair.serve.gateway_health.HealthProber`)."""

    def mark_down(self, b: Backend, why: str) -> None: ...

    def suspect(self, b: Backend, why: str) -> None: ...


class BackendProxy:
    """Streams released requests from the backends (the module docstring)."""

    def __init__(self, cfg: HealthConfig, *, backend_key: str | None, backend_priority: bool,
                 now: Callable[[], float], on_served: Callable[[Request, int, int, float], None],
                 wake: Callable[[], None], endings: JobEndings, signals: BackendSignals) -> None:
        self.cfg = cfg
        self.backend_key = backend_key
        self.backend_priority = backend_priority    # send vLLM `priority` (backend_identity.py)
        self.now = now
        self.on_served = on_served
        self.wake = wake
        self.endings = endings
        self.signals = signals

    def headers(self, job: GatewayJob) -> dict[str, str]:
        h = {k: v for k, v in job.g.forward_headers.items() if k.lower().startswith("x-tokenfair-")}
        if self.backend_key is not None:
            h["authorization"] = f"Bearer {self.backend_key}"
        else:
            for k, v in job.g.forward_headers.items():
                if k.lower() in ("authorization", "x-api-key"):
                    h[k.lower()] = v
        g = job.g
        if g.klass and "x-tokenfair-class" not in h:
            h["x-tokenfair-class"] = g.klass
        if g.deadline_s is not None and "x-tokenfair-deadline-s" not in h:
            h["x-tokenfair-deadline-s"] = repr(g.deadline_s)
        if g.priority is not None and "x-tokenfair-priority" not in h:
            h["x-tokenfair-priority"] = repr(g.priority)
        if g.kept_prompt is not None:          # sent as bytes (payload): httpx does not set it then
            h["content-type"] = "application/json"
        return h

    def body(self, job: GatewayJob, b: Backend) -> dict:
        body = {k: v for k, v in job.g.raw.items() if k != "tokenfair"}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if not body.get("model") and b.models:
            body["model"] = b.models[0]
        req = job.req
        return tag_body(body, req.tenant, req.klass, req.priority,
                        backend_priority=self.backend_priority)

    def payload(self, job: GatewayJob, b: Backend) -> dict:
        """httpx's body arguments: the body as JSON; a kept prompt spliced in as bytes."""
        kept = job.g.kept_prompt
        if kept is None:
            return {"json": self.body(job, b)}
        return {"content": body_bytes(self.body(job, b), kept)}

    async def run(self, client: httpx.AsyncClient, job: GatewayJob, b: Backend) -> None:
        """Proxy ``job`` to ``b`` until it ends, is re-queued, or its task is cancelled."""
        req, g = job.req, job.g
        path = "/chat/completions" if g.kind == "chat" else "/completions"
        chat = g.kind == "chat"
        finish_reason = None
        usage = None
        prompt_est = req.prompt_tokens
        try:
            cfg = self.cfg
            async with client.stream("POST", b.url + path, **self.payload(job, b), headers=self.headers(job),
                                     timeout=httpx.Timeout(cfg.first_token_timeout_s,
                                                           connect=cfg.connect_timeout_s)) as resp:
                if resp.status_code != 200:
                    await self._backend_refused(job, b, resp)
                    return
                lines = timed_lines(resp.aiter_lines(), cfg.first_token_timeout_s, cfg.inter_chunk_timeout_s,
                                    lambda: req.num_output > 0)
                async for chunk in data_chunks(lines):
                    usage, finish_reason = self._take_chunk(job, b, chunk, chat, usage, finish_reason)
            self._on_complete(job, b, usage, finish_reason, prompt_est)
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            self.signals.mark_down(b, f"{type(err).__name__}")
            b.window.on_overload(job.released_s, self.now())
            self.endings.requeue_or_fail(job, b, Reason(ReasonCode.BACKEND_UNAVAILABLE, f"{b.name}: {type(err).__name__}"), 503)
        except (_StreamError, httpx.HTTPError) as err:
            self._stream_failed(job, b, err)

    def _take_chunk(self, job: GatewayJob, b: Backend, chunk: dict, chat: bool, usage, finish_reason):
        """One streamed chunk: an error chunk raises; tokens go to the client; returns the
        (usage, finish reason) seen so far."""
        if "error" in chunk:
            err = parse_backend_error(0, chunk["error"] if isinstance(chunk["error"], dict)
                                      else {"message": str(chunk["error"])})
            raise _StreamError(from_upstream(err.code, ReasonCode.BACKEND_ERROR, f"{b.name}: {err.message}"), err)
        m = chunk.get("model")
        if m:
            if not job.model:
                job.model = m
            if m not in b.models:
                b.models.append(m)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            text = (c.get("delta") or {}).get("content") if chat else c.get("text")
            if text:
                self._on_token(job, b, text)
            if c.get("finish_reason"):
                finish_reason = c["finish_reason"]
        return usage, finish_reason

    def _stream_failed(self, job: GatewayJob, b: Backend, err: Exception) -> None:
        """A backend error mid-request: not retried when the backend says a retry cannot help,
        re-queued when nothing reached the client yet, else failed."""
        req = job.req
        b.errors += 1
        if isinstance(err, httpx.TimeoutException):
            self.signals.suspect(b, f"{type(err).__name__}: {err}")
        reason = err.reason if isinstance(err, _StreamError) \
            else Reason(ReasonCode.BACKEND_ERROR, f"{b.name}: {type(err).__name__}: {err}")
        if isinstance(err, _StreamError) and not err.error.retry:
            code = err.error.code or "backend_error"
            self.endings.end(job, Status.FAILED, reason, Failed(502, err.error.message, code, param=err.error.param),
                             http_status=502)
        elif req.num_output == 0:
            self.endings.requeue_or_fail(job, b, reason, 502)
        else:
            self.endings.end(job, Status.FAILED, reason, Failed(502, f"request failed: {reason.text}", ReasonCode.BACKEND_ERROR),
                             http_status=502)

    async def _backend_refused(self, job: GatewayJob, b: Backend, resp: httpx.Response) -> None:
        err = parse_backend_error(resp.status_code, await resp.aread(), resp.headers.get("x-should-retry"))
        status = resp.status_code
        reason = from_upstream(err.code, ReasonCode.BACKEND_STATUS, f"{b.name} answered {status}: {err.message}")
        if status in (429, 503) and err.retry:
            b.window.on_overload(job.released_s, self.now())
            self.endings.requeue_or_fail(job, b, reason, status)
        elif status >= 500 and err.retry:
            b.errors += 1
            self.endings.requeue_or_fail(job, b, reason, 502)
        else:   # the request's own fault: passed on as the backend said it, not retried
            self.endings.end(job, Status.FAILED, reason, Failed(status, err.message, err.code or "backend_status",
                                                                param=err.param), http_status=status)

    def _on_token(self, job: GatewayJob, b: Backend, text: str) -> None:
        req = job.req
        now = self.now()
        if req.first_token_s is None:
            req.first_token_s = now
            ttft = now - job.released_s
            b.ttft_ewma_s = ttft if b.ttft_ewma_s is None else (
                b.ttft_ewma_s + BACKEND_EWMA_WEIGHT * (ttft - b.ttft_ewma_s))
            b.window.on_first_token(ttft, req.prompt_tokens, job.released_s, b.inflight, now)
            req.num_computed = req.prompt_tokens + 1
            req.num_output = 1
            self.on_served(req, req.prompt_tokens, 1, now)
            self.wake()              # the window may have grown
        else:
            req.num_output += 1
            req.num_computed += 1
            self.on_served(req, 0, 1, now)
        job.q.put_nowait(Delta(text, 1))

    def _on_complete(self, job: GatewayJob, b: Backend, usage, finish_reason, prompt_est: int) -> None:
        req = job.req
        now = self.now()
        if usage:
            p = int(usage.get("prompt_tokens") or req.prompt_tokens)
            n = int(usage.get("completion_tokens") or req.num_output)
            extra_prompt = max(0, p - req.prompt_tokens) if req.num_output else p
            extra_out = max(0, n - req.num_output)
            req.prompt_tokens = p
            if n > 0 and req.first_token_s is None:
                req.first_token_s = now
            req.num_output = n
            req.num_computed = p + n
            if extra_prompt or extra_out:
                self.on_served(req, extra_prompt, extra_out, now)
        if req.first_token_s is not None and req.num_output > 1:
            tpot = (now - req.first_token_s) / (req.num_output - 1)
            b.tpot_ewma_s = tpot if b.tpot_ewma_s is None else (
                b.tpot_ewma_s + BACKEND_EWMA_WEIGHT * (tpot - b.tpot_ewma_s))
        b.served += 1
        fr = finish_reason or ("length" if req.num_output >= req.max_tokens else "stop")
        self.endings.end(job, Status.FINISHED, backend_finished(fr),
                         Done(fr, req.prompt_tokens, req.num_output), finish_reason=fr)


class _StreamError(Exception):
    def __init__(self, reason: Reason, error: BackendError) -> None:
        super().__init__(reason.text)
        self.reason = reason
        self.error = error
