"""The gateway's per-backend concurrency window and backend state.

Window (per backend, documented AIMD on time to first token).  A backend that is given
more work than it runs at once queues it internally, which shows up as TTFT far above
what the same prompt length gets on an unloaded backend.  Per prompt-length bucket
(powers of two) the window keeps a baseline TTFT: the lowest observed, forgotten slowly
(it drifts up ``baseline_drift`` per second so old minima expire).  On each first token:

  * TTFT <= ``tolerance`` x baseline + ``slack_s`` ("not queueing") and the window is in
    use (in flight >= window - 1): grow -- by 1 per response in slow start (doubling per
    round trip, until the first decrease), then by 1/window per response (+1 per round);
  * TTFT above that target: shrink to ``beta`` x window (at least ``min``), at most once
    per round trip: requests released before the last decrease do not shrink it again;
  * a 429/503 answer or a connection error: shrink (and retry the request elsewhere).

:class:`Backend` is one backend's state as the gateway's dispatcher and proxy see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WindowConfig:
    initial: float = 2.0
    min: float = 1.0
    max: float = 256.0
    tolerance: float = 2.0
    slack_s: float = 0.05
    beta: float = 0.7
    baseline_drift: float = 0.01
    max_inflight_tokens: int | None = None


def _bucket(prompt_tokens: int) -> int:
    return max(0, int(prompt_tokens).bit_length() - 6)


class AdaptiveWindow:
    """AIMD concurrency window driven by time to first token (see the module docstring)."""

    def __init__(self, cfg: WindowConfig) -> None:
        self.cfg = cfg
        self.window = float(max(cfg.min, min(cfg.max, cfg.initial)))
        self.baseline: dict[int, tuple[float, float]] = {}     # bucket -> (ttft, when observed)
        self.slow_start = True
        self.last_decrease_s = -math.inf
        self.increases = 0
        self.decreases = 0

    @property
    def limit(self) -> int:
        return max(1, int(self.window))

    def baseline_s(self, prompt_tokens: int, now: float) -> float | None:
        b = self.baseline.get(_bucket(prompt_tokens))
        if b is None:
            return None
        return b[0] * (1.0 + self.cfg.baseline_drift) ** max(0.0, now - b[1])

    def target_s(self, prompt_tokens: int, now: float) -> float | None:
        base = self.baseline_s(prompt_tokens, now)
        return None if base is None else self.cfg.tolerance * base + self.cfg.slack_s

    def on_first_token(self, ttft: float, prompt_tokens: int, released_s: float, inflight: int, now: float) -> None:
        target = self.target_s(prompt_tokens, now)
        base = self.baseline_s(prompt_tokens, now)
        if base is None or ttft < base:
            self.baseline[_bucket(prompt_tokens)] = (ttft, now)
        if target is not None and ttft > target:
            self._decrease(released_s, now)
            return
        if inflight >= self.window - 1:
            self.window = min(self.cfg.max, self.window + (1.0 if self.slow_start else 1.0 / self.window))
            self.increases += 1

    def on_overload(self, released_s: float, now: float) -> None:
        self._decrease(released_s, now)

    def _decrease(self, released_s: float, now: float) -> None:
        if released_s < self.last_decrease_s:
            return                       # released under the old window: already accounted for
        self.slow_start = False
        self.window = max(self.cfg.min, self.window * self.cfg.beta)
        self.last_decrease_s = now
        self.decreases += 1


@dataclass
class Backend:
    url: str                          # base URL ending in /v1
    window: AdaptiveWindow
    name: str = ""
    up: bool = True
    next_probe_s: float = 0.0
    probe_backoff_s: float = 0.5
    inflight: int = 0
    inflight_tokens: int = 0
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    served: int = 0
    errors: int = 0
    models: list[str] = field(default_factory=list)

    def room(self) -> int:
        return self.window.limit - self.inflight


def normalize_backend_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"backend {url!r}: expected an http(s):// URL")
    return u if u.endswith("/v1") else u + "/v1"
