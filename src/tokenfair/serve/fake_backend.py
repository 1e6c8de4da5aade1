"""A fake OpenAI-compatible backend (tests, the gateway and fleet benchmarks, rehearsals
without GPUs: ``tokenfair fake-backend``).

Two timings.  Fixed (no ``profile``): requests are served strictly FIFO with at most
``concurrency`` at once (an asyncio semaphore: waiters are woken in arrival order), each
emitting ``max_tokens`` tokens, the first after ``ttft_s``, each next after
``token_delay_s``.  Profile: continuous batching with at most ``max_running`` requests whose
steps take a simulator profile's step time (``fake_engine.BatchEngine``).
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
    state = {"active": 0, "max_active": 0, "served": 0, "order": [], "queued": 0, "bodies": []}
    app.state.stats = state
    engine = BatchEngine(profile, max_running, time_scale) if profile is not None else None
    app.state.engine = engine
    sem: asyncio.Semaphore | None = None

    def get_sem() -> asyncio.Semaphore:
        nonlocal sem
        if sem is None:
            sem = asyncio.Semaphore(concurrency)
        return sem

    async def metrics():
        if engine is not None:
            stats = engine.stats()
        else:                       # KV use: the share of the concurrency slots held
            stats = {"num_requests_running": float(state["active"]),
                     "num_requests_waiting": float(state["queued"]),
                     "kv_cache_usage_perc": state["active"] / (concurrency + 1)}
        return PlainTextResponse(vllm_metrics_text(stats, model))

    if vllm_metrics:
        app.get("/metrics")(metrics)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "fake"}]}

    async def handle(request: Request, chat: bool):
        body = await request.json()
        state["bodies"].append(body)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if chat:
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            text = body.get("prompt", "")
            if isinstance(text, list) and text and isinstance(text[0], list):
                text = text[0]
            text = text if isinstance(text, str) else " ".join(map(str, text))
        prompt_tokens = max(1, len(text.split()))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:12]
        obj = "chat.completion.chunk" if chat else "text_completion"
        tag = request.headers.get("x-test-tag", "")

        def chunk(text=None, finish=None):
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}

        async def batched():
            seq = engine.submit(prompt_tokens, n)
            state["active"] += 1
            state["max_active"] = max(state["max_active"], state["active"])
            state["order"].append(tag)
            try:
                while (i := await seq.out.get()) is not DONE:
                    yield f" t{i}"
            finally:
                engine.cancel(seq)
                state["active"] -= 1
                state["served"] += 1

        async def tokens():
            if engine is not None:
                async for t in batched():
                    yield t
                return
            state["queued"] += 1
            try:
                await get_sem().acquire()
            finally:
                state["queued"] -= 1
            try:
                state["active"] += 1
                state["max_active"] = max(state["max_active"], state["active"])
                state["order"].append(tag)
                try:
                    await asyncio.sleep(ttft_s)
                    for i in range(n):
                        if i:
                            await asyncio.sleep(token_delay_s)
                        yield f" t{i}"
                finally:
                    state["active"] -= 1
                    state["served"] += 1
            finally:
                get_sem().release()

        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def gen():
                async for t in tokens():
                    yield f"data: {json.dumps(chunk(t))}\n\n"
                yield f"data: {json.dumps(chunk(None, 'length'))}\n\n"
                if include_usage:
                    yield f"data: {json.dumps({**chunk(), 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(gen(), media_type="text/event-stream")
        parts = [t async for t in tokens()]
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model, "choices": [choice], "usage": usage})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, True)

    return app
