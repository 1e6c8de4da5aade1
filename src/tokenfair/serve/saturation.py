"""A backend window driven by the backend's own saturation signals, with the latency window
as the fallback.

vLLM exports, on ``GET /metrics`` (Prometheus text), how many requests it holds in its own
waiting queue (``vllm:num_requests_waiting``), how many it runs (``vllm:num_requests_running``)
and the fraction of its KV cache in use (``vllm:kv_cache_usage_perc``, 0..1).  A backend
with requests waiting, or with its KV cache nearly full, is *saturated*: more work released
to it only queues there, in its FIFO order instead of the gateway's fair order.  A backend
that is not saturated is given more.  This is the rule llm-d's saturation detector applies
per pod (queue depth and KV usage against thresholds).  TTFT-driven AIMD
(:class:`~tokenfair.serve.gateway_window.AdaptiveWindow`) cannot tell a batch that runs
slower because it is larger from a queue: on the CPU the step time grows with the batch and
the latency window settles far below what the backend runs at once.

Per reading (``poll_s`` apart; ``inflight``: this gateway's requests on the backend;
``starting``: those of them whose first token is late -- released longer ago than the TTFT
rule's target for their prompt -- which the gateway knows itself):

  * requests waiting (``> max_waiting``), or (with ``max_starting`` set) more of ours late (a
    prefill backlog: vLLM admits a burst at once and works through the prompts chunk by
    chunk, so its own queue looks empty while a new request would wait behind them):
    window = what the backend runs of ours,
    ``max(min, min(window, inflight - max(waiting, starting - max_starting)))``;
  * KV usage ``>= max_kv_usage``: no growth, ``window = max(min, min(window, inflight))``;
  * otherwise, with the window in use (``inflight >= window - 1``): grow by
    ``max(1, growth x window)`` (at most ``max``).

Between readings, at each release: a driven backend whose *prefill backlog* (prompt tokens
of ours released to it without a first token yet, :func:`prefill_backlog`) would exceed
``max_prefill_tokens`` with the candidate's prompt gets nothing more until one of them starts
(:meth:`SaturationWindow.admits_prompt`): vLLM's own queue does not show that backlog.

Without a fresh reading (no ``/metrics``, no vLLM names in it, older than ``max_age_s``) the
window falls back to the TTFT rule.  A 429/503 or a connection error shrinks it either way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from .defaults import DEFAULT_MAX_PREFILL_TOKENS
from .gateway_window import AdaptiveWindow, WindowConfig

WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
RETRY_UNSUPPORTED_S = 30.0          # a backend without the metrics is asked again this often
METRICS_TIMEOUT_S = 1.0
UNKNOWN_TTFT_S = 1.0                # a first token later than this is late, before any was seen


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
    """One reading of a backend's /metrics."""
    num_waiting: float               # requests in the backend's own queue (>= 0)
    num_running: float               # requests the backend runs (>= 0)
    kv_usage: float                  # fraction of its KV cache in use, 0..1
    at_s: float                      # when read (the gateway's clock)


def parse_vllm_metrics(text: str, now: float) -> Saturation | None:
    """The saturation signals in a Prometheus text page (summed over label sets, e.g. one per
    engine); None when the page has no ``vllm:num_requests_waiting``."""
    sums = {WAITING_METRIC: 0.0, RUNNING_METRIC: 0.0, KV_USAGE_METRIC: 0.0}
    seen: set[str] = set()
    kv_series = 0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in sums:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isnan(value):
            continue
        sums[name] += value
        seen.add(name)
        kv_series += name == KV_USAGE_METRIC
    if WAITING_METRIC not in seen:
        return None
    kv = sums[KV_USAGE_METRIC] / kv_series if kv_series else 0.0     # the mean over engines
    return Saturation(sums[WAITING_METRIC], sums[RUNNING_METRIC], kv, now)


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


def prefill_backlog(jobs) -> int:
    """Prompt tokens of ``jobs`` (released to one backend) without a first token yet.

    vLLM admits up to ``--max-num-seqs`` requests into its running batch at once (128 by
    default on the CPU) and prefills them chunk by chunk, in arrival order: after a burst its
    own queue (``vllm:num_requests_waiting``) is empty while a prompt sent now waits behind
    every prompt it took.  The gateway knows that backlog itself; bounding it
    (``SaturationConfig.max_prefill_tokens``) keeps the rest of a burst in the gateway's fair
    queue, where a request of a newly arriving tenant is released first."""
    return sum(j.req.prompt_tokens for j in jobs if j.req.first_token_s is None)


def late_first_tokens(backend, jobs: list, now: float) -> int:
    """How many of ``jobs`` (released to ``backend``) have no first token yet although they
    were released longer ago than the TTFT rule's target for their prompt (``tolerance`` x
    the lowest TTFT seen for that prompt length, + slack; ``UNKNOWN_TTFT_S`` before any)."""
    w = backend.window
    latency = w.latency if isinstance(w, SaturationWindow) else w
    n = 0
    for j in jobs:
        req = j.req
        if req.first_token_s is None:
            target = latency.target_s(req.prompt_tokens, now)
            if now - j.released_s > (UNKNOWN_TTFT_S if target is None else target):
                n += 1
    return n


def make_window(cfg: WindowConfig, sat: SaturationConfig | None) -> AdaptiveWindow | SaturationWindow:
    """The window a backend gets: saturation-driven (with the TTFT fallback) or TTFT only."""
    return AdaptiveWindow(cfg) if sat is None else SaturationWindow(cfg, sat)


def metrics_url(backend_url: str) -> str:
    """``http://host:port/metrics`` for a backend base URL ending in ``/v1``."""
    return backend_url.removesuffix("/v1") + "/metrics"


async def read_saturation(client, url: str, now: float, headers: dict[str, str]) -> Saturation | None | bool:
    """One reading: a :class:`Saturation`, None (no vLLM metrics there), or False (no answer)."""
    import httpx
    try:
        r = await client.get(url, headers=headers, timeout=METRICS_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return None
    return parse_vllm_metrics(r.text, now)


async def poll_saturation(backends: list, client, clock: Callable[[], float], stopped: Callable[[], bool],
                          wake: Callable[[], None], headers: dict[str, str],
                          starting: Callable[[object], int] = lambda b: 0) -> None:
    """A gateway task: read each up backend's /metrics every ``poll_s``, apply the readings,
    ``wake`` the dispatcher when a window grew; ends when ``stopped()``.  ``starting(b)``:
    the gateway's requests on ``b`` without a first token."""
    windows = [b for b in backends if isinstance(b.window, SaturationWindow)]
    if not windows:
        return
    step_s = min(b.window.sat.poll_s for b in windows)
    while not stopped():
        now = clock()
        due = [b for b in windows if b.up and now >= b.window.next_poll_s]
        readings = await asyncio.gather(*(read_saturation(client, metrics_url(b.url), now, headers) for b in due))
        grew = False
        for b, reading in zip(due, readings):
            w: SaturationWindow = b.window
            if reading is None:
                w.supported = False
                w.next_poll_s = now + RETRY_UNSUPPORTED_S
                continue
            w.next_poll_s = now + w.sat.poll_s
            if reading is not False:
                w.supported = True
                grew |= w.on_reading(reading, b.inflight, starting(b))
        if grew:
            wake()
        await asyncio.sleep(step_s)
