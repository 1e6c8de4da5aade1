"""A backend's concurrency window: how many requests a gateway releases to one backend.
Pure rules (no I/O, the caller's clock): ``tokenfair gateway`` (serve/gateway_dispatch.py,
serve/saturation.py's poller) and the fleet simulator's gateway (sim/fleet_gate.py) run them.

*TTFT rule* (:class:`AdaptiveWindow`, AIMD on time to first token).  A backend that is given
more work than it runs at once queues it internally, which shows up as TTFT far above what
the same prompt length gets on an unloaded backend.  Per prompt-length bucket (powers of two)
the window keeps a baseline TTFT: the lowest observed, forgotten slowly (it drifts up
``baseline_drift`` per second so old minima expire).  On each first token:

  * TTFT <= ``tolerance`` x baseline + ``slack_s`` ("not queueing") and the window is in
    use (in flight >= window - 1): grow -- by 1 per response in slow start (doubling per
    round trip, until the first decrease), then by 1/window per response (+1 per round);
  * TTFT above that target: shrink to ``beta`` x window (at least ``min``), at most once
    per round trip: requests released before the last decrease do not shrink it again;
  * a 429/503 answer or a connection error: shrink (and retry the request elsewhere).

*Saturation rule* (:class:`SaturationWindow`, the TTFT rule as its fallback), from readings
of the backend's own queue, running count and KV use (vLLM's ``/metrics``; the simulator
reads its replica).  A backend with requests waiting, or with its KV cache nearly full, is
saturated: more work released to it only queues there, in its FIFO order instead of the
gateway's fair order.  This is the rule llm-d's saturation detector applies per pod (queue
depth and KV usage against thresholds).  TTFT-driven AIMD cannot tell a batch that runs
slower because it is larger from a queue: on the CPU the step time grows with the batch and
the latency window settles far below what the backend runs at once.  Per reading
(``poll_s`` apart; ``inflight``: this gateway's requests on the backend; ``starting``: those
of them whose first token is late):

  * requests waiting (``> max_waiting``), or (with ``max_starting`` set) more of ours late:
    window = what the backend runs of ours,
    ``max(min, min(window, inflight - max(waiting, starting - max_starting)))``;
  * KV usage ``>= max_kv_usage``: no growth, ``window = max(min, min(window, inflight))``;
  * otherwise, with the window in use (``inflight >= window - 1``): grow by
    ``max(1, growth x window)`` (at most ``max``).

Between readings, at each release: a driven backend whose *prefill backlog* (prompt tokens
of ours released to it without a first token yet) would exceed ``max_prefill_tokens`` with
the candidate's prompt gets nothing more until one of them starts
(:meth:`SaturationWindow.admits_prompt`): vLLM's own queue does not show that backlog.
Without a fresh reading (older than ``max_age_s``) the window falls back to the TTFT rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# a gateway's prefill backlog per backend, in prompt tokens: a quarter of vLLM's default step
# budget on the CPU (max_num_batched_tokens 2048), so a prompt released behind a full backlog
# is prefilled in the next step, and that step stays short
DEFAULT_MAX_PREFILL_TOKENS = 512


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


@dataclass(frozen=True)
class SaturationConfig:
    max_waiting: float = 0.0         # backend queue length above this: saturated
    max_kv_usage: float = 0.9        # KV cache fraction at or above this: saturated
    poll_s: float = 0.25             # between readings of one backend's /metrics
    max_age_s: float = 2.0           # an older reading no longer drives the window
    growth: float = 0.5              # unsaturated, window in use: += max(1, growth x window)
    # late first tokens tolerated (None: not used, the default; on the CPU backend it showed no
    # clear gain in a tokenfair bench vllm run: max_prefill_tokens bounds that backlog instead)
    max_starting: int | None = None
    # the prefill backlog a driven backend may hold of ours: prompt tokens released to it and
    # still without a first token (None: no bound; see prefill_backlog)
    max_prefill_tokens: int | None = DEFAULT_MAX_PREFILL_TOKENS

    def __post_init__(self) -> None:
        if self.max_waiting < 0 or not 0 < self.max_kv_usage <= 1 or self.poll_s <= 0 or self.growth <= 0:
            raise ValueError("saturation: need max_waiting >= 0, 0 < max_kv_usage <= 1, poll_s > 0, growth > 0")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise ValueError("saturation: max_prefill_tokens must be >= 1 (or None: no bound)")


@dataclass(frozen=True, slots=True)
class Saturation:
    """One reading of a backend's saturation signals (vLLM's /metrics; a simulated replica's state)."""
    num_waiting: float               # requests in the backend's own queue (>= 0)
    num_running: float               # requests the backend runs (>= 0)
    kv_usage: float                  # fraction of its KV cache in use, 0..1
    at_s: float                      # when read (the gateway's clock)


class SaturationWindow:
    """A backend's window: saturation-driven while readings are fresh, else the TTFT rule
    (the wrapped :class:`AdaptiveWindow`, whose ``window`` value both rules move)."""

    def __init__(self, cfg: WindowConfig, sat: SaturationConfig) -> None:
        self.latency = AdaptiveWindow(cfg)
        self.cfg = cfg
        self.sat = sat
        self.reading: Saturation | None = None
        self.supported = True            # False after a /metrics page without vLLM's names
        self.next_poll_s = 0.0

    @property
    def window(self) -> float:
        return self.latency.window

    @property
    def limit(self) -> int:
        return self.latency.limit

    @property
    def increases(self) -> int:
        return self.latency.increases

    @property
    def decreases(self) -> int:
        return self.latency.decreases

    def is_driven(self, now: float) -> bool:
        """A fresh reading drives the window (the TTFT rule is ignored)."""
        return self.reading is not None and now - self.reading.at_s <= self.sat.max_age_s

    def on_reading(self, reading: Saturation, inflight: int, starting: int = 0) -> bool:
        """Apply one reading; True when the window grew (the dispatcher may release more).
        ``starting``: this gateway's requests on the backend without a first token yet."""
        self.reading = reading
        lat, cfg = self.latency, self.cfg
        before = lat.window
        backlog = 0 if self.sat.max_starting is None else starting - self.sat.max_starting
        if reading.num_waiting > self.sat.max_waiting or backlog > 0:
            lat.window = max(cfg.min, min(lat.window, inflight - max(reading.num_waiting, backlog)))
        elif reading.kv_usage >= self.sat.max_kv_usage:
            lat.window = max(cfg.min, min(lat.window, float(inflight)))
        elif inflight >= lat.window - 1:
            lat.window = min(cfg.max, lat.window + max(1.0, self.sat.growth * lat.window))
        if lat.window > before:
            lat.increases += 1
        elif lat.window < before:
            lat.slow_start = False
            lat.decreases += 1
        return lat.window > before

    def admits_prompt(self, backlog_tokens: int, prompt_tokens: int, now: float) -> bool:
        """May a prompt of ``prompt_tokens`` be released while ``backlog_tokens`` of ours wait
        for their first token there?  Always while the window is not driven (no vLLM metrics)
        or the backlog is empty (one prompt always goes, however long)."""
        cap = self.sat.max_prefill_tokens
        return (cap is None or backlog_tokens <= 0 or not self.is_driven(now)
                or backlog_tokens + prompt_tokens <= cap)

    def on_first_token(self, ttft: float, prompt_tokens: int, released_s: float, inflight: int, now: float) -> None:
        if not self.is_driven(now):
            self.latency.on_first_token(ttft, prompt_tokens, released_s, inflight, now)

    def on_overload(self, released_s: float, now: float) -> None:
        self.latency.on_overload(released_s, now)


def make_window(cfg: WindowConfig, sat: SaturationConfig | None) -> AdaptiveWindow | SaturationWindow:
    """The window a backend gets: saturation-driven (with the TTFT fallback) or TTFT only."""
    return AdaptiveWindow(cfg) if sat is None else SaturationWindow(cfg, sat)
