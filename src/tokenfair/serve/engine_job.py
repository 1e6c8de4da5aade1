"""The request bridge of ``serve`` mode: a :class:`ServeJob` collects the token ids the
engine samples for one request (worker thread) and turns them, on the asyncio side, into
text deltas (incremental detokenization, stop strings) and one terminal event."""

from __future__ import annotations

import asyncio
from collections import deque

from ..core.request import Request, Status
from .jobs import Delta, Done, GenRequest, Job, failed_event


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids (holds back incomplete UTF-8)."""

    def __init__(self, decode) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        prefix_text = self.decode(self.ids[self.prefix:self.read])
        new_text = self.decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        prefix_text = self.decode(self.ids[self.prefix:self.read])
        new_text = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""


class ServeJob(Job):
    def __init__(self, g: GenRequest, req: Request, decode, stops: list[str], model: str) -> None:
        super().__init__(g, req)
        self.model = model
        self.q: asyncio.Queue = asyncio.Queue()
        self.ready: deque = deque()
        self.detok = IncrementalDetokenizer(decode) if decode is not None else None
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""
        self.stopped = False
        self.buf: list[int] = []        # token ids sampled in the current step (worker thread)
        self.ended = False

    # worker thread
    def on_token(self, token_id: int | None, finish_reason: str | None, dirty: list) -> None:
        if token_id is None:
            return
        if not self.buf:
            dirty.append(self)
        self.buf.append(token_id)

    # asyncio thread
    def _text(self, delta: str, final: bool) -> str:
        if self.stopped:
            return ""
        self.pending += delta
        if self.stops:
            hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
            if hits:
                out, self.pending, self.stopped = self.pending[:min(hits)], "", True
                return out
            if not final and self.hold:
                cut = max(0, len(self.pending) - self.hold)
                out, self.pending = self.pending[:cut], self.pending[cut:]
                return out
        out, self.pending = self.pending, ""
        return out

    def _consume(self, item) -> None:
        kind = item[0]
        if kind == "tok":
            ids = item[1]
            text = self.detok.push(ids) if self.detok is not None else ""
            self.ready.append(Delta(self._text(text, False), len(ids)))
            return
        req = self.req
        if req.status is Status.FINISHED:
            tail = self.detok.flush() if self.detok is not None else ""
            text = self._text(tail, True)
            if text:
                self.ready.append(Delta(text, 0))
            payload = req.payload
            reason = getattr(payload, "finish_reason", None)
            if reason not in ("stop", "length"):
                reason = "length" if req.num_output >= req.max_tokens else "stop"
            if self.stopped:
                reason = "stop"
            self.ready.append(Done(reason, req.prompt_tokens, len(getattr(payload, "output_ids", ())) or req.num_output))
        else:
            self.ready.append(failed_event(req))
        self.finished.set()

    async def next_event(self):
        while not self.ready:
            self._consume(await self.q.get())
        return self.ready.popleft()


def deliver(items) -> None:
    for job, item in items:
        job.q.put_nowait(item)
