"""A fake OpenAI-compatible backend (tests, the gateway and fleet benchmarks, rehearsals
without GPUs: ``tokenfair fake-backend``).

Two timings.  Fixed (no ``profile``): requests are served strictly FIFO with at most
``concurrency`` at once (an asyncio semaphore: waiters are woken in arrival order), each
emitting ``max_tokens`` tokens, the first after ``ttft_s``, each next after
``token_delay_s`` (paced from the request's start, so delays do not accumulate on a busy
host).  Profile: continuous batching with at most ``max_running`` requests whose steps take
a simulator profile's step time (``fake_engine.BatchEngine``).
Prompt tokens are counted as whitespace-separated words (token-id prompts exactly).
Streaming (with ``usage`` when asked) and non-streaming ``/v1/completions`` and
``/v1/chat/completions``, ``GET /v1/models``, ``GET /metrics`` (vLLM's gauge names:
``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc``, token
counters).  No auth: any key works.  ``app.state.stats['bodies']`` keeps every request body
as received (tests check what a gateway sent).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..core.costmodel import Profile
from .fake_engine import DONE, BatchEngine, vllm_metrics_text


def create_fake_backend(concurrency: int = 2, token_delay_s: float = 0.005, ttft_s: float = 0.0,
                        model: str = "fake-model", profile: Profile | None = None, max_running: int = 16,
                        time_scale: float = 1.0, vllm_metrics: bool = True) -> FastAPI:
    """``vllm_metrics``: serve ``GET /metrics`` with vLLM's gauge names (on by default)."""
    app = FastAPI()
    engine = BatchEngine(profile, max_running, time_scale) if profile is not None else None
    fake = FakeBackend(model, concurrency, token_delay_s, ttft_s, engine)
    app.state.stats = fake.state
    app.state.engine = engine
    if vllm_metrics:
        app.get("/metrics")(fake.metrics)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "fake"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await fake.handle(request, False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await fake.handle(request, True)

    return app


def prompt_tokens_of(body: dict, chat: bool) -> int:
    """Whitespace-separated words of the prompt (token ids: exactly), at least 1."""
    if chat:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    else:
        text = body.get("prompt", "")
        if isinstance(text, list) and text and isinstance(text[0], list):
            text = text[0]
        text = text if isinstance(text, str) else " ".join(map(str, text))
    return max(1, len(text.split()))


class FakeBackend:
    """The server's state: ``state`` counts (tests read ``app.state.stats``); requests run on
    ``engine`` (profile timing) or, without one, under a FIFO semaphore of ``concurrency``."""

    def __init__(self, model: str, concurrency: int, token_delay_s: float, ttft_s: float,
                 engine: BatchEngine | None) -> None:
        self.model, self.concurrency = model, concurrency
        self.token_delay_s, self.ttft_s, self.engine = token_delay_s, ttft_s, engine
        self.state = {"active": 0, "max_active": 0, "served": 0, "order": [], "queued": 0, "bodies": []}
        self.sem: asyncio.Semaphore | None = None     # made on the serving loop

    async def metrics(self):
        if self.engine is not None:
            stats = self.engine.stats()
        else:                       # KV use: the share of the concurrency slots held
            stats = {"num_requests_running": float(self.state["active"]),
                     "num_requests_waiting": float(self.state["queued"]),
                     "kv_cache_usage_perc": self.state["active"] / (self.concurrency + 1)}
        return PlainTextResponse(vllm_metrics_text(stats, self.model))

    def _started(self, tag: str) -> None:
        state = self.state
        state["active"] += 1
        state["max_active"] = max(state["max_active"], state["active"])
        state["order"].append(tag)

    def _ended(self) -> None:
        self.state["active"] -= 1
        self.state["served"] += 1

    async def batched_tokens(self, prompt_tokens: int, n: int, tag: str):
        seq = self.engine.submit(prompt_tokens, n)
        self._started(tag)
        try:
            while (i := await seq.out.get()) is not DONE:
                yield f" t{i}"
        finally:
            self.engine.cancel(seq)
            self._ended()

    async def paced_tokens(self, n: int, tag: str):
        if self.sem is None:
            self.sem = asyncio.Semaphore(self.concurrency)
        self.state["queued"] += 1
        try:
            await self.sem.acquire()
        finally:
            self.state["queued"] -= 1
        try:
            self._started(tag)
            try:
                # paced on the loop's clock from the start: a late wake-up on a busy host
                # shortens the next wait, so a request takes ttft_s + (n-1) x token_delay_s
                loop = asyncio.get_running_loop()
                start = loop.time()
                for i in range(n):
                    await asyncio.sleep(max(0.0, start + self.ttft_s + i * self.token_delay_s - loop.time()))
                    yield f" t{i}"
            finally:
                self._ended()
        finally:
            self.sem.release()

    async def handle(self, request: Request, chat: bool):
        body = await request.json()
        self.state["bodies"].append(body)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt_tokens = prompt_tokens_of(body, chat)
        tag = request.headers.get("x-test-tag", "")
        tokens = self.batched_tokens(prompt_tokens, n, tag) if self.engine is not None else self.paced_tokens(n, tag)
        reply = Reply(self.model, chat, {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                         "total_tokens": prompt_tokens + n})
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(reply.stream(tokens, include_usage), media_type="text/event-stream")
        return JSONResponse(reply.whole("".join([t async for t in tokens])))


class Reply:
    """The OpenAI shapes of one answer: stream chunks or the whole response."""

    def __init__(self, model: str, chat: bool, usage: dict) -> None:
        self.model, self.chat, self.usage = model, chat, usage
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:12]

    def chunk(self, text=None, finish=None) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.model, "choices": [choice]}

    async def stream(self, tokens, include_usage: bool):
        async for t in tokens:
            yield f"data: {json.dumps(self.chunk(t))}\n\n"
        yield f"data: {json.dumps(self.chunk(None, 'length'))}\n\n"
        if include_usage:
            yield f"data: {json.dumps({**self.chunk(), 'choices': [], 'usage': self.usage})}\n\n"
        yield "data: [DONE]\n\n"

    def whole(self, text: str) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if self.chat else {"index": 0, "text": text, "finish_reason": "length"})
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": int(time.time()), "model": self.model, "choices": [choice], "usage": self.usage}
