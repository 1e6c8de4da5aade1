"""A linear step-time profile fitted from a service's own request records (``tokenfair shadow``
when no calibrated profile is given).

The records carry, per request, admission (``scheduled_s``), first token and finish times.
Two least-squares fits, each clamped to non-negative coefficients:

  decode   TPOT ~ decode_base_s + decode_seq_s * n, where n is the number of requests the
           service was running at the middle of the request's decode (from all records'
           [scheduled_s, finish_s] intervals): a decode step's time and how it grows with the
           batch;
  prefill  (first_token_s - scheduled_s) - one decode step ~ prefill_batch_s
           + prefill_token_s * prompt_tokens: the first step's extra time (one step: with
           prompts longer than the contract's chunk_size the simulator pays prefill_batch_s
           per chunk, which such records do not show).

The service's turnover latency (:func:`dispatch_gap_s`: the mean time from a request's end
to the next admission while requests were waiting) idles a slot once per request; it is
spread over the mean number of decode steps and added to ``decode_base_s``.

A simulated step with a prefill costs every decode in it the prefill's time; the measured
TPOT already includes that for the fraction of steps that held one (admissions per second x
step time), so that share is taken off ``decode_base_s``: the simulated mean decode step then
matches the measured TPOT whether or not the service couples prefills and decodes.

KV capacity is not visible in records: the fitted profile has ``kv_tokens`` (default: large
enough that memory never binds), so the contract's ``engine.max_running`` bounds the batch
as it bounds the service.  At least ``MIN_FIT_REQUESTS`` finished requests with two or more
output tokens are needed.
"""

from __future__ import annotations

import numpy as np

from ..core.costmodel import Profile

MIN_FIT_REQUESTS = 10
DEFAULT_KV_TOKENS = 1 << 26


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 minimising |a + b x - y|^2."""
    if len(x) >= 2 and np.ptp(x) > 0:
        b, a = np.polyfit(x, y, 1)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    a_only = max(0.0, float(np.mean(y)))
    if len(x) >= 1 and float(np.dot(x, x)) > 0:
        b_only = max(0.0, float(np.dot(x, y) / np.dot(x, x)))
        if np.sum((b_only * x - y) ** 2) < np.sum((a_only - y) ** 2):
            return 0.0, b_only
    return a_only, 0.0


def dispatch_gap_s(records: list[dict]) -> float:
    """Mean time from a request's end to the next admission while others were waiting: the
    service's own turnover latency (the simulator admits at the next step, with none).  The
    mean, not the median: what the queue feels is the capacity lost in total, and on a busy
    host the gaps are heavy-tailed; gaps past the 95th percentile (a policy holding work back)
    are left out."""
    sched = [r for r in records if r.get("scheduled_s") is not None]
    arrivals = np.sort([r["arrival_s"] for r in sched])
    starts = np.sort([r["scheduled_s"] for r in sched])
    ends = np.sort([r["finish_s"] for r in sched if r.get("finish_s") is not None])
    if not len(ends) or not len(starts):
        return 0.0
    waiting = np.searchsorted(arrivals, ends, side="right") - np.searchsorted(starts, ends, side="right")
    nxt = np.searchsorted(starts, ends, side="left")
    ok = (waiting > 0) & (nxt < len(starts))
    if not ok.any():
        return 0.0
    gaps = starts[nxt[ok]] - ends[ok]
    return float(np.mean(gaps[gaps <= np.percentile(gaps, 95)]))


def fit_profile(records: list[dict], name: str = "fitted-from-records", kv_tokens: int = DEFAULT_KV_TOKENS) -> Profile:
    done = [r for r in records if r.get("status") == "finished" and r.get("first_token_s") is not None
            and r.get("scheduled_s") is not None and (r.get("output_tokens") or 0) >= 2]
    if len(done) < MIN_FIT_REQUESTS:
        raise ValueError(f"the records hold {len(done)} finished requests with 2+ output tokens; a profile needs "
                         f"at least {MIN_FIT_REQUESTS}: record a longer run or pass --profile")
    starts = np.sort([r["scheduled_s"] for r in records if r.get("scheduled_s") is not None and r.get("finish_s") is not None])
    ends = np.sort([r["finish_s"] for r in records if r.get("scheduled_s") is not None and r.get("finish_s") is not None])
    mids = np.array([(r["first_token_s"] + r["finish_s"]) / 2 for r in done])
    running = (np.searchsorted(starts, mids, side="right") - np.searchsorted(ends, mids, side="right")).astype(float)
    tpot = np.array([(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in done])
    base, per_seq = _nonneg_lstsq(running, tpot)
    first = np.array([r["first_token_s"] - r["scheduled_s"] for r in done])
    prompt = np.array([float(r["prompt_tokens"]) for r in done])
    extra = first - (base + per_seq * running)      # unclamped: clamping each sample biases the fit up
    batch, per_token = _nonneg_lstsq(prompt, extra)
    # the simulator adds a prefill's time to every decode in its step; the measured TPOT already
    # holds that share (a fraction of the steps had a prefill), so it comes off the decode base
    span = max(1e-9, float(ends[-1] - starts[0])) if len(starts) else 1e-9
    frac = min(1.0, len(starts) / span * float(np.mean(tpot)))
    base = max(0.0, base - frac * (batch + per_token * float(np.mean(prompt))))
    # the dispatch gap idles a slot once per request: spread over the request's decode steps
    base += dispatch_gap_s(records) / max(1.0, float(np.mean([r["output_tokens"] - 1 for r in done])))
    return Profile(name=name, kind="linear", prefill_batch_s=batch, prefill_token_s=per_token,
                   decode_base_s=base, decode_seq_s=per_seq, overhead_s=0.0,
                   kv_capacity_tokens=kv_tokens, swap_capacity_tokens=0)

