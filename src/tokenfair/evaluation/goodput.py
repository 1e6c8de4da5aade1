"""Work done, counted so that refusing work never raises a figure.

* *in-time goodput*: prompt + output tokens of finished requests whose first token came
  within their class's max wait (a request of a class without one: finished);
* *SLO goodput*: prompt + output tokens of finished requests that met their TTFT and TPOT
  SLOs (and their deadline, if any) -- ``metrics.meets_slo``;
* *outcomes*: every request that did not finish, counted by status and reason code (a
  :class:`~tokenfair.core.reasons.ReasonCode` value read from the record's reason by
  :func:`~tokenfair.core.reasons.code_of`; e.g. ``rejected.overloaded``);
* *finished tokens by a horizon*: the prompt + output tokens of the requests finished by
  time ``h``; two policies' throughput on one workload is compared as their finished tokens
  by the same horizon (the earlier of their last finishes), not as tokens per second of each
  one's own makespan, which rises when work is rejected.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.reasons import code_of


def tokens(rec: dict) -> int:
    return rec["prompt_tokens"] + rec["output_tokens"]


def in_time(rec: dict) -> bool:
    if rec["status"] != "finished":
        return False
    limit = rec["max_wait_s"]
    return limit is None or rec["first_token_s"] - rec["arrival_s"] <= limit


def outcomes(recs: list[dict]) -> dict[str, dict[str, int]]:
    """status -> reason code -> count, for every request that did not finish."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in recs:
        if r["status"] != "finished":
            out[r["status"]][code_of(r["reason"]).value] += 1
    return {s: dict(sorted(c.items())) for s, c in sorted(out.items())}


def goodput(recs: list[dict], slo_met: list[bool]) -> dict:
    """Finished, in-time and SLO-meeting tokens of ``recs`` (``slo_met[i]``: record i met its
    SLOs, as ``metrics.meets_slo`` decided)."""
    finished = in_time_tok = slo_tok = 0
    n_in_time = 0
    for r, ok in zip(recs, slo_met):
        if r["status"] != "finished":
            continue
        n = tokens(r)
        finished += n
        if in_time(r):
            in_time_tok += n
            n_in_time += 1
        if ok:
            slo_tok += n
    return {"finished_tokens": finished, "in_time_tokens": in_time_tok, "in_time_requests": n_in_time,
            "slo_tokens": slo_tok}


def last_finish_s(recs: list[dict]) -> float:
    return max((r["finish_s"] for r in recs if r["finish_s"] is not None), default=0.0)


def finished_tokens_by(recs: list[dict], horizon_s: float) -> int:
    return sum(tokens(r) for r in recs if r["status"] == "finished" and r["finish_s"] <= horizon_s)


def vs_baseline(recs: list[dict], base_recs: list[dict]) -> dict:
    """Finished tokens of ``recs`` and of the baseline's records by the same horizon (the
    earlier of the two last finishes) and their ratio (None when the baseline finished none)."""
    horizon = min(last_finish_s(recs), last_finish_s(base_recs))
    mine, base = finished_tokens_by(recs, horizon), finished_tokens_by(base_recs, horizon)
    return {"horizon_s": horizon, "finished_tokens": mine, "baseline_finished_tokens": base,
            "ratio": mine / base if base else None}
