"""What the HTTP layer exchanges with a service: the job events (:class:`Delta`,
:class:`Done`, :class:`Failed`), the validated :class:`GenRequest`, the :class:`Job` event
stream and the :class:`RecordSink` of terminal request records."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..core.reasons import Reason, ReasonCode
from ..core.request import Request
from .errors import ServiceError, http_status_of, retry_header, retry_hint_s
from .kept_prompt import KeptPrompt
from .openai_schema import ChatCompletionRequest, CompletionRequest


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
    param: str | None = None

    def __post_init__(self) -> None:
        self.headers = {**retry_header(self.status, self.code), **self.headers}

    def error(self) -> ServiceError:
        return ServiceError(self.status, self.message, self.code, self.param, headers=self.headers)


def failed_event(req: Request) -> Failed:
    status = http_status_of(req)
    code = req.reason_code or ReasonCode.UNSPECIFIED
    headers: dict[str, str] = {}
    if status == 503:
        headers = {"retry-after": "1"}
    elif status == 429:                         # shed from the queue (fair/review.py)
        headers = {"retry-after": str(max(1, math.ceil(retry_hint_s(req.reason))))}
    return Failed(status, f"request {req.status.value}: {req.reason}", code, headers)


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
    prompt_ids: list[int] | None = None   # set by Service.prepare (serve: tokenized off the event loop)
    min_prompt_tokens: int = 0            # >= 0: a lower bound on the prompt's tokens (body_precheck)
    kept_prompt: KeptPrompt | None = None  # set: a big body's prompt as bytes; body/raw hold a stand-in (gateway)

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
        self.fault: Reason | None = None   # set: this request's own event handling raised (the reason)

    async def next_event(self) -> Delta | Done | Failed:
        raise NotImplementedError

    async def next_event_or_fault(self) -> Delta | Done | Failed:
        """``next_event``, or -- when turning this request's tokens into text raises (a
        detokenizer or stop-string fault) -- a 500 ``request_fault`` for it alone; the
        caller then ends the job with ``fault`` as its reason."""
        try:
            return await self.next_event()
        except Exception as err:  # noqa: BLE001 - the fault stays with this request
            self.fault = Reason(ReasonCode.REQUEST_FAULT, f"{type(err).__name__}: {err}")
            return Failed(500, self.fault.text, ReasonCode.REQUEST_FAULT)

    async def collect(self) -> tuple[str, Done | Failed]:
        parts = []
        while True:
            ev = await self.next_event_or_fault()
            if isinstance(ev, Delta):
                parts.append(ev.text)
            else:
                return "".join(parts), ev


RECORDS_IN_MEMORY = 10_000


class RecordSink:
    """Terminal request records: the last ``keep`` in memory, all appended to ``path``.

    The in-memory ring is what a long-lived server's memory grows by until it is full
    (about 2.5 KB a record: ~25 MB at the default); the file has them all."""

    def __init__(self, path: str | Path | None = None, keep: int = RECORDS_IN_MEMORY) -> None:
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
