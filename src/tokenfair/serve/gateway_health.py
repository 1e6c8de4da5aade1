"""The gateway's view of its backends' health: active probes, timeouts, and what happens to
the requests of a backend that stops answering.

Probes: ``GET /v1/models`` with the gateway's ``--backend-key`` (the admin credentials), to
every backend -- up ones every ``probe_interval_s``, down ones with back-off.  A backend is
*up* while it answers 200 within ``probe_timeout_s``; ``probe_failures_down`` failures in a
row (no answer, a 5xx, or a 401/403 to the gateway's own key) mark it down.  Without a backend
key a 401/403 only shows the backend is alive (it has nothing to check the key against).

Timeouts of a proxied request: ``connect_timeout_s`` to connect, ``first_token_timeout_s``
until the first text chunk, ``inter_chunk_timeout_s`` between chunks after it.  A timeout
counts as a failed probe of that backend and triggers a probe at once.

A backend marked down is drained: each request in flight on it is cancelled with the reason
``backend_unavailable: backend N stopped answering (...)``; one that has streamed nothing yet
is re-queued for another backend (within ``max_retries``), the others fail with that reason.
So a backend that is SIGSTOPped is detected within about ``probe_failures_down x
(probe_interval_s + probe_timeout_s)`` seconds and holds no request after that.

:class:`HealthProber` holds the probe state of every backend; the gateway hands it the
backends, its clock and two callbacks (``wake``: a backend came back, dispatch again;
``drain``: cancel what runs on a backend that went down), and the HTTP client per call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.reasons import Reason, ReasonCode
from .gateway_window import Backend


class HealthConfig(BaseModel):
    """The gateway's timeouts and probing (all in seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    first_token_timeout_s: float = Field(default=120.0, gt=0)
    inter_chunk_timeout_s: float = Field(default=30.0, gt=0)
    probe_interval_s: float = Field(default=1.0, gt=0)
    probe_timeout_s: float = Field(default=1.5, gt=0)
    probe_failures_down: int = Field(default=2, ge=1)
    max_probe_backoff_s: float = Field(default=5.0, gt=0)

    @classmethod
    def from_options(cls, **options: float) -> "HealthConfig":
        """The config from CLI options; a bad value is a ValueError naming its ``--option``."""
        try:
            return cls(**options)
        except ValidationError as err:
            e = err.errors()[0]
            name = "--" + str(e["loc"][0]).replace("_", "-")
            raise ValueError(f"{name}: {e['msg'].lower()}, got {e.get('input')!r}") from None


@dataclass
class ProbeState:
    failures: int = 0                      # consecutive failed probes (or timed-out requests)
    reason: str = ""                       # why the last probe failed
    probing: bool = False                  # a probe is in flight
    models_known: bool = False             # a probe (or a client call) listed its models


class ChunkTimeout(httpx.ReadTimeout):
    """No first token / next chunk from a backend within the configured timeout."""


async def timed_lines(lines, first_timeout_s: float, inter_chunk_timeout_s: float, got_first):
    """``lines`` (an async iterator of SSE lines), raising :class:`ChunkTimeout` when the
    next line takes longer than ``first_timeout_s`` (until ``got_first()``) or
    ``inter_chunk_timeout_s`` (after)."""
    it = lines.__aiter__()
    while True:
        limit = inter_chunk_timeout_s if got_first() else first_timeout_s
        try:
            async with asyncio.timeout(limit):      # a timer per line, no task (wait_for makes one)
                line = await it.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            what = "next chunk" if got_first() else "first token"
            raise ChunkTimeout(f"no {what} within {limit:g} s") from None
        yield line


class HealthProber:
    """Probes the gateway's backends, marks them down and up (the module docstring).

    ``backends``: the gateway's list (shared, not copied: a backend's ``up``, ``models`` and
    probe schedule live on it); ``now``: the gateway's clock; ``wake()``: called when a
    backend comes back up; ``drain(b, reason)``: cancel the requests in flight on ``b``."""

    def __init__(self, backends: list[Backend], cfg: HealthConfig, backend_key: str | None, *,
                 now: Callable[[], float], wake: Callable[[], None],
                 drain: Callable[[Backend, Reason], None]) -> None:
        self.backends = backends
        self.cfg = cfg
        self.backend_key = backend_key
        self.now = now
        self.wake = wake
        self.drain = drain
        self.states = {b.url: ProbeState() for b in backends}     # backend URL -> its probes

    def state(self, b: Backend) -> ProbeState:
        return self.states[b.url]

    def label(self, b: Backend) -> str:
        """How errors name a backend (never its address): ``backend N``, 1-based."""
        return f"backend {self.backends.index(b) + 1}"

    async def probe(self, client: httpx.AsyncClient, b: Backend) -> bool:
        """Probe ``b`` once (a probe already in flight is not doubled); True when it is up."""
        st = self.state(b)
        if st.probing:
            return b.up
        st.probing = True
        key = self.backend_key
        try:
            r = await client.get(b.url + "/models", timeout=self.cfg.probe_timeout_s,
                                 headers={"authorization": f"Bearer {key}"} if key else {})
        except httpx.HTTPError as err:
            return self.probe_failed(b, f"{type(err).__name__} after {self.cfg.probe_timeout_s:g} s")
        finally:
            st.probing = False
        if r.status_code >= 500 or (key is not None and r.status_code in (401, 403)):
            why = "rejects the gateway's --backend-key" if r.status_code in (401, 403) else "answered"
            return self.probe_failed(b, f"{why} {r.status_code}")
        if r.status_code == 200:
            self.learn_models(b, r)
        self.probe_ok(b)
        return True

    def learn_models(self, b: Backend, r: httpx.Response) -> None:
        try:
            b.models = [m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m]
            self.state(b).models_known = True
        except (ValueError, AttributeError, TypeError):
            pass

    def probe_ok(self, b: Backend) -> None:
        st = self.state(b)
        st.failures, st.reason = 0, ""
        b.probe_backoff_s = self.cfg.probe_interval_s
        b.next_probe_s = self.now() + self.cfg.probe_interval_s
        if not b.up:
            b.up = True
            self.wake()

    def probe_failed(self, b: Backend, why: str) -> bool:
        st = self.state(b)
        st.failures += 1
        st.reason = why
        if b.up and st.failures >= self.cfg.probe_failures_down:
            self.mark_down(b, why)
        elif not b.up:
            b.probe_backoff_s = min(self.cfg.max_probe_backoff_s, b.probe_backoff_s * 2)
            b.next_probe_s = self.now() + b.probe_backoff_s
        else:
            b.next_probe_s = self.now()           # probe again at once
        return False

    def suspect(self, b: Backend, why: str) -> None:
        """A request to ``b`` timed out: count it as a failed probe and probe now."""
        self.probe_failed(b, why)

    def mark_down(self, b: Backend, why: str) -> None:
        if b.up:
            b.up = False
            b.probe_backoff_s = self.cfg.probe_interval_s
            self.drain(b, Reason(ReasonCode.BACKEND_UNAVAILABLE, f"{self.label(b)} stopped answering ({why})"))
        b.next_probe_s = self.now() + b.probe_backoff_s

    async def first_probes(self, client: httpx.AsyncClient) -> None:
        """Probe every backend once at start-up; one that fails is down from the start."""
        await asyncio.gather(*(self.probe(client, b) for b in self.backends))
        for b in self.backends:
            st = self.state(b)
            if st.failures:
                self.mark_down(b, st.reason)

    async def run(self, client: httpx.AsyncClient, stopped: Callable[[], bool]) -> None:
        """The probe loop: every backend whose next probe is due, until ``stopped()``."""
        while not stopped():
            await asyncio.sleep(min(0.25, self.cfg.probe_interval_s))
            now = self.now()
            due = [b for b in self.backends if now >= b.next_probe_s and not self.state(b).probing]
            if due:
                await asyncio.gather(*(self.probe(client, b) for b in due))

    def model_names(self) -> list[str]:
        """The backends' model ids, each once, in backend order."""
        names: list[str] = []
        for b in self.backends:
            for m in b.models:
                if m not in names:
                    names.append(m)
        return names

    async def list_models(self, client: httpx.AsyncClient, headers) -> list[str]:
        """The backends' model ids; asked of an up backend with the client's own key when no
        probe could list them (no ``--backend-key``)."""
        names = self.model_names()
        if names:
            return names
        auth = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key")}
        for b in self.backends:
            if not b.up:
                continue
            try:
                r = await client.get(b.url + "/models", headers=auth, timeout=self.cfg.probe_timeout_s)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                self.learn_models(b, r)
        return self.model_names()
