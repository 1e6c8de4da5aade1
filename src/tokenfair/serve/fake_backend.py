"""A deterministic fake OpenAI-compatible backend (tests and the gateway overhead benchmark).

It serves requests strictly FIFO with at most ``concurrency`` at once (an asyncio
semaphore: waiters are woken in arrival order), then emits ``max_tokens`` tokens: the
first after ``ttft_s``, each next after ``token_delay_s``.  Prompt tokens are counted as
whitespace-separated words.  Streaming (with ``usage`` when asked) and non-streaming
``/v1/completions`` and ``/v1/chat/completions``, ``GET /v1/models``.  No auth: any key works.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def create_fake_backend(concurrency: int = 2, token_delay_s: float = 0.005, ttft_s: float = 0.0,
                        model: str = "fake-model", vllm_metrics: bool = False) -> FastAPI:
    """``vllm_metrics``: also serve ``GET /metrics`` with vLLM's saturation gauges (requests
    waiting for the semaphore, requests holding it, KV usage = holding / concurrency)."""
    app = FastAPI()
    state = {"active": 0, "max_active": 0, "served": 0, "order": [], "bodies": [], "pending": 0}
    app.state.stats = state
    sem: asyncio.Semaphore | None = None

    def get_sem() -> asyncio.Semaphore:
        nonlocal sem
        if sem is None:
            sem = asyncio.Semaphore(concurrency)
        return sem

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "fake"}]}

    if vllm_metrics:
        from fastapi.responses import PlainTextResponse

        @app.get("/metrics")
        async def metrics():
            waiting = state["pending"] - state["active"]
            return PlainTextResponse(
                f'vllm:num_requests_waiting{{model_name="{model}"}} {float(waiting)}\n'
                f'vllm:num_requests_running{{model_name="{model}"}} {float(state["active"])}\n'
                f'vllm:kv_cache_usage_perc{{model_name="{model}"}} {state["active"] / (concurrency + 1)}\n')

    async def handle(request: Request, chat: bool):
        body = await request.json()
        state["bodies"].append(body)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if chat:
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            text = body.get("prompt", "")
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

        async def tokens():
            state["pending"] += 1
            try:
                async for t in _served():
                    yield t
            finally:
                state["pending"] -= 1

        async def _served():
            async with get_sem():
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
