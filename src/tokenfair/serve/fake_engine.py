"""The fake backend's engine: continuous batching timed by a simulator profile.

One loop runs steps while there is work.  Each step admits waiting requests (FIFO) while
fewer than ``max_running`` run -- a newly admitted request's whole prompt is prefilled in
that step -- and takes ``profile.step_s(prefills, decode contexts, decodes) x time_scale``
seconds (the same step-time arithmetic as the simulator); then every running request gets
one token (the first token of a prefilled one), and finished ones leave.  Each request's
tokens go to its own queue; a request abandoned by its client (``cancel``) leaves at the
next step.  ``stats()`` gives vLLM-style gauges for ``/metrics``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from ..core.costmodel import Profile

DONE = None        # the queue's end marker


@dataclass(eq=False)
class FakeSeq:
    prompt_tokens: int          # >= 1
    max_tokens: int             # >= 1, tokens to produce (ignore_eos)
    produced: int = 0
    cancelled: bool = False
    out: asyncio.Queue = field(default_factory=asyncio.Queue)   # ints (token index), then DONE


class BatchEngine:
    def __init__(self, profile: Profile, max_running: int = 16, time_scale: float = 1.0) -> None:
        if max_running <= 0 or time_scale <= 0:
            raise ValueError("fake backend: max_running and time_scale must be > 0")
        self.profile = profile
        self.max_running = max_running
        self.time_scale = time_scale
        self.waiting: deque[FakeSeq] = deque()
        self.running: list[FakeSeq] = []
        self.num_steps = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.max_active = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def submit(self, prompt_tokens: int, max_tokens: int) -> FakeSeq:
        seq = FakeSeq(max(1, prompt_tokens), max(1, max_tokens))
        self.waiting.append(seq)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._loop())
        assert self._wake is not None
        self._wake.set()
        return seq

    def cancel(self, seq: FakeSeq) -> None:
        seq.cancelled = True

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            await self._step()

    async def _step(self) -> None:
        self.running = [s for s in self.running if not s.cancelled]
        new: list[FakeSeq] = []
        while self.waiting and len(self.running) + len(new) < self.max_running:
            s = self.waiting.popleft()
            if not s.cancelled:
                new.append(s)
        decode_ctx = sum(s.prompt_tokens + s.produced for s in self.running)
        dt = self.profile.step_s([(s.prompt_tokens, 0) for s in new], decode_ctx, len(self.running))
        self.running.extend(new)
        self.max_active = max(self.max_active, len(self.running))
        self.prompt_tokens_total += sum(s.prompt_tokens for s in new)
        await asyncio.sleep(dt * self.time_scale)
        self.num_steps += 1
        still: list[FakeSeq] = []
        for s in self.running:
            if s.cancelled:
                continue
            s.out.put_nowait(s.produced)
            s.produced += 1
            self.generation_tokens_total += 1
            if s.produced >= s.max_tokens:
                s.out.put_nowait(DONE)
            else:
                still.append(s)
        self.running = still

    def stats(self) -> dict[str, float]:
        kv = sum(s.prompt_tokens + s.produced for s in self.running)
        return {"num_requests_running": float(len(self.running)), "num_requests_waiting": float(len(self.waiting)),
                "kv_cache_usage_perc": min(1.0, kv / self.profile.kv_capacity_tokens),
                "prompt_tokens_total": float(self.prompt_tokens_total),
                "generation_tokens_total": float(self.generation_tokens_total)}


def vllm_metrics_text(stats: dict[str, float], model: str) -> str:
    """The vLLM gauge / counter names (``vllm:...``) in Prometheus text format."""
    kinds = {"num_requests_running": "gauge", "num_requests_waiting": "gauge", "kv_cache_usage_perc": "gauge",
             "prompt_tokens_total": "counter", "generation_tokens_total": "counter"}
    lines = []
    for name, kind in kinds.items():
        lines.append(f"# TYPE vllm:{name} {kind}")
        lines.append(f'vllm:{name}{{model_name="{model}"}} {stats.get(name, 0.0)}')
    return "\n".join(lines) + "\n"
