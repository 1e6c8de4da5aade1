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

That closed-form fit prices a prompt's prefill as one step.  :func:`calibrate_to_records`
then replays the records in the simulator under the contract that was live, so prefills
run as the simulated engine runs them (in ``chunk_size`` chunks, or a whole prefill budget
for a light tenant's prompt under ``fair``, each chunk step paying ``prefill_batch_s`` and
slowing the decodes beside it), and rescales the prefill coefficients by measured / simulated
mean prefill time (admission to first token) and the decode coefficients by measured /
simulated mean TPOT, until both agree within ``CALIBRATION_TOLERANCE`` (at most
``MAX_CALIBRATION_ROUNDS`` replays).

KV capacity is not visible in records: the fitted profile has ``kv_tokens`` (default: large
enough that memory never binds), so the contract's ``engine.max_running`` bounds the batch
as it bounds the service.  At least ``MIN_FIT_REQUESTS`` finished requests with two or more
output tokens are needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.costmodel import Profile

MIN_FIT_REQUESTS = 10
DEFAULT_KV_TOKENS = 1 << 26
CALIBRATION_TOLERANCE = 0.01        # measured / simulated mean within 1%: done
MAX_CALIBRATION_ROUNDS = 8
PREFILL_FIELDS = ("prefill_batch_s", "prefill_token_s", "prefill_attn_s")
DECODE_FIELDS = ("decode_base_s", "decode_seq_s", "decode_ctx_s")


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


def fit_records(records: list[dict]) -> list[dict]:
    """The records a fit reads: finished, admitted, with a first token and 2+ output tokens."""
    return [r for r in records if r.get("status") == "finished" and r.get("first_token_s") is not None
            and r.get("scheduled_s") is not None and (r.get("output_tokens") or 0) >= 2]


def fit_profile(records: list[dict], name: str = "fitted-from-records", kv_tokens: int = DEFAULT_KV_TOKENS) -> Profile:
    done = fit_records(records)
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



def service_moments(records: list[dict], ids: set[str]) -> tuple[float, float]:
    """(mean prefill time: admission to first token, mean TPOT) over the records in ``ids``."""
    done = [r for r in fit_records(records) if r["request_id"] in ids]
    if not done:
        return 0.0, 0.0
    prefill = [r["first_token_s"] - r["scheduled_s"] for r in done]
    tpot = [(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in done]
    return float(np.mean(prefill)), float(np.mean(tpot))


def scaled_profile(p: Profile, prefill: float, decode: float, name: str) -> Profile:
    """``p`` with its prefill coefficients x ``prefill`` and decode coefficients x ``decode``
    (a new Profile: its step-cost arithmetic is built from the new values)."""
    d = p.model_dump()
    for f in PREFILL_FIELDS:
        d[f] *= prefill
    for f in DECODE_FIELDS:
        d[f] *= decode
    d["name"] = name
    return Profile(**d)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What :func:`calibrate_to_records` did (reported by ``tokenfair shadow``)."""

    rounds: int                       # simulator replays run (>= 1)
    prefill_error: float              # simulated / measured mean prefill time - 1, before the last rescale
    tpot_error: float                 # simulated / measured mean TPOT - 1, before the last rescale


def calibrate_to_records(records: list[dict], workload, contract, profile: Profile, policy: str = "fair",
                         max_rounds: int = MAX_CALIBRATION_ROUNDS) -> tuple[Profile, Calibration]:
    """Rescale ``profile`` until the simulator replaying ``workload`` (the records as a trace)
    under ``contract`` matches the records' mean prefill time and mean TPOT (module doc)."""
    from ..sim.simulate import simulate
    ids = {str(r["request_id"]) for r in fit_records(records)}
    want_prefill, want_tpot = service_moments(records, ids)
    if want_prefill <= 0 or want_tpot <= 0:
        return profile, Calibration(0, 0.0, 0.0)
    p = profile
    if all(getattr(p, f) == 0 for f in PREFILL_FIELDS):     # nothing to rescale: start per token
        mean_prompt = float(np.mean([r["prompt_tokens"] for r in records if str(r["request_id"]) in ids]))
        p = Profile(**{**p.model_dump(), "prefill_token_s": want_prefill / max(1.0, mean_prompt)})
    rounds, err_p, err_d = 0, 0.0, 0.0
    for rounds in range(1, max_rounds + 1):
        got_prefill, got_tpot = service_moments(simulate(workload, policy, contract, p, isolated=False).records, ids)
        err_p = got_prefill / want_prefill - 1 if got_prefill > 0 else float("inf")
        err_d = got_tpot / want_tpot - 1 if got_tpot > 0 else float("inf")
        if abs(err_p) <= CALIBRATION_TOLERANCE and abs(err_d) <= CALIBRATION_TOLERANCE:
            break
        p = scaled_profile(p, want_prefill / got_prefill if got_prefill > 0 else 1.0,
                           want_tpot / got_tpot if got_tpot > 0 else 1.0, profile.name)
    return p, Calibration(rounds, err_p, err_d)
