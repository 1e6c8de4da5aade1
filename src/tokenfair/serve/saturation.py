"""The gateway's side of the saturation-driven window: reading vLLM's ``/metrics`` (Prometheus
text: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``)
into a :class:`Saturation`, polling each backend every ``poll_s`` and applying the readings,
and what the gateway knows itself (its prefill backlog and late first tokens per backend).
The window's rules are :mod:`tokenfair.sched.backend_window` (pure, shared with the fleet
simulator); ``SaturationConfig``, ``Saturation``, ``SaturationWindow`` and ``make_window`` stay
importable from here.  A 429/503 or a connection error shrinks the window either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..sched.backend_window import (Saturation, SaturationConfig, SaturationWindow, make_window)
from .prometheus_text import sum_series

__all__ = ["Saturation", "SaturationConfig", "SaturationWindow", "make_window", "parse_vllm_metrics",
           "prefill_backlog", "late_first_tokens", "metrics_url", "read_saturation", "poll_saturation"]

WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
METRIC_NAMES = frozenset({WAITING_METRIC, RUNNING_METRIC, KV_USAGE_METRIC})
RETRY_UNSUPPORTED_S = 30.0          # a backend without the metrics is asked again this often
METRICS_TIMEOUT_S = 1.0
UNKNOWN_TTFT_S = 1.0                # a first token later than this is late, before any was seen


def parse_vllm_metrics(text: str, now: float) -> Saturation | None:
    """The saturation signals in a Prometheus text page (summed over label sets, e.g. one per
    engine); None when the page has no ``vllm:num_requests_waiting``."""
    sums = sum_series(text, METRIC_NAMES)
    if WAITING_METRIC not in sums:
        return None
    kv, kv_series = sums.get(KV_USAGE_METRIC, (0.0, 0))
    kv = kv / kv_series if kv_series else 0.0     # the mean over engines
    return Saturation(sums[WAITING_METRIC][0], sums.get(RUNNING_METRIC, (0.0, 0))[0], kv, now)


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
