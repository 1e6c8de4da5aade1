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
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.reasons import Reason, ReasonCode


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


class BackendHealth:
    """Probing and draining of :class:`~tokenfair.serve.gateway.Gateway`'s backends (a mixin)."""

    def _probe_state(self, b) -> ProbeState:
        return self.probe_states[b.url]

    def _label(self, b) -> str:
        return f"backend {self.backends.index(b) + 1}"

    async def _probe(self, b) -> bool:
        st = self._probe_state(b)
        if st.probing:
            return b.up
        st.probing = True
        key = self.backend_key
        try:
            r = await self.client.get(b.url + "/models", timeout=self.health_cfg.probe_timeout_s,
                                      headers={"authorization": f"Bearer {key}"} if key else {})
        except httpx.HTTPError as err:
            return self._probe_failed(b, f"{type(err).__name__} after {self.health_cfg.probe_timeout_s:g} s")
        finally:
            st.probing = False
        if r.status_code >= 500 or (key is not None and r.status_code in (401, 403)):
            why = "rejects the gateway's --backend-key" if r.status_code in (401, 403) else "answered"
            return self._probe_failed(b, f"{why} {r.status_code}")
        if r.status_code == 200:
            self._learn_models(b, r)
        self._probe_ok(b)
        return True

    def _learn_models(self, b, r: httpx.Response) -> None:
        try:
            b.models = [m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m]
            self._probe_state(b).models_known = True
        except (ValueError, AttributeError, TypeError):
            pass

    def _probe_ok(self, b) -> None:
        st = self._probe_state(b)
        st.failures, st.reason = 0, ""
        b.probe_backoff_s = self.health_cfg.probe_interval_s
        b.next_probe_s = self.now() + self.health_cfg.probe_interval_s
        if not b.up:
            b.up = True
            if self.wake is not None:
                self.wake.set()

    def _probe_failed(self, b, why: str) -> bool:
        st = self._probe_state(b)
        st.failures += 1
        st.reason = why
        if b.up and st.failures >= self.health_cfg.probe_failures_down:
            self._mark_down(b, why)
        elif not b.up:
            b.probe_backoff_s = min(self.health_cfg.max_probe_backoff_s, b.probe_backoff_s * 2)
            b.next_probe_s = self.now() + b.probe_backoff_s
        else:
            b.next_probe_s = self.now()           # probe again at once
        return False

    def _suspect(self, b, why: str) -> None:
        """A request to ``b`` timed out: count it as a failed probe and probe now."""
        self._probe_failed(b, why)

    def _mark_down(self, b, why: str) -> None:
        if b.up:
            b.up = False
            b.probe_backoff_s = self.health_cfg.probe_interval_s
            self._drain_backend(b, why)
        b.next_probe_s = self.now() + b.probe_backoff_s

    def _drain_backend(self, b, why: str) -> None:
        reason = Reason(ReasonCode.BACKEND_UNAVAILABLE, f"{self._label(b)} stopped answering ({why})")
        current = asyncio.current_task()
        for job in list(self.running):
            if job.backend is b and job.task is not None and not job.task.done() and job.task is not current:
                job.cancel_reason = reason
                job.requeue_on_cancel = True
                job.task.cancel()

    async def _first_probes(self) -> None:
        """Probe every backend once at start-up; one that fails is down from the start."""
        await asyncio.gather(*(self._probe(b) for b in self.backends))
        for b in self.backends:
            st = self._probe_state(b)
            if st.failures:
                self._mark_down(b, st.reason)

    async def _probe_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(min(0.25, self.health_cfg.probe_interval_s))
            now = self.now()
            due = [b for b in self.backends if now >= b.next_probe_s and not self._probe_state(b).probing]
            if due:
                await asyncio.gather(*(self._probe(b) for b in due))

    async def list_models(self, headers) -> list[str]:
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
                r = await self.client.get(b.url + "/models", headers=auth, timeout=self.health_cfg.probe_timeout_s)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                self._learn_models(b, r)
        return self.model_names()
