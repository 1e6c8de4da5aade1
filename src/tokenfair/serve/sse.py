"""Server-sent-event streaming for the HTTP layer: the disconnect-aware :class:`EventStream`
response, the client-disconnect race helpers and the OpenAI chunk framing of a job's events."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from .jobs import Delta, Done, GenRequest, Job
from .openai_schema import SSE_DONE, error_body, now_s, sse, stream_chunk, usage_chunk


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


async def client_disconnected(request: HTTPRequest) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def race(coro, watcher: asyncio.Future):
    """Result of ``coro``, or None if ``watcher`` (client disconnect) finishes first."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    return None


async def sse_event(job: Job, first, kind: str, g: GenRequest) -> AsyncIterator[bytes]:
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
        ev = await job.next_event_or_fault()
