"""The shedding counterfactual: one workload with load shedding on and off.

A request is *shed* when the policy refused it for its predicted wait (reason code
``overloaded``): at arrival (``rejected``) or from the queue (``expired``, fair's reviews as
its max wait nears, ``sched/fair/review.py``).  With the same workload, contract (shedding
switched off) and profile run again, a shed request *would have waited past its max wait*
when, unshed, its wait (admission, or its end if it never ran, minus arrival) exceeded its
class's ``max_wait_s``.

  precision = |shed and would have waited past|  /  |shed|
  recall    = |shed and would have waited past|  /  |waited past, unshed|

Precision says how much of the refused work the engine could not have done in time anyway;
recall how much of the overdue work shedding turned into an early, honest 429.  Both are
None when their denominator is empty.  Shedding that is right or does not happen has
precision near 1 wherever it sheds.
"""

from __future__ import annotations

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.reasons import ReasonCode, code_of
from ..workloads.workload import Workload

SHED_REASON = ReasonCode.OVERLOADED
SHED_STATUSES = ("rejected", "expired")       # at arrival, from the queue


def wait_s(rec: dict) -> float | None:
    """Its wait: admission, or its end if it never ran, minus arrival (None: neither)."""
    end = rec["scheduled_s"] if rec["scheduled_s"] is not None else rec["finish_s"]
    return None if end is None else end - rec["arrival_s"]


def waited_past(rec: dict) -> bool:
    limit = rec["max_wait_s"]
    if limit is None:
        return False
    wait = wait_s(rec)
    return wait is None or wait > limit


def shed(rec: dict) -> bool:
    return rec["status"] in SHED_STATUSES and code_of(rec["reason"]) is SHED_REASON


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def shedding_scores(on: list[dict], off: list[dict]) -> dict:
    """Precision and recall of the shedding in run ``on`` against the same workload's run
    ``off`` (records matched by request id), in total and per tenant."""
    unshed = {r["request_id"]: r for r in off}
    rows: dict[str, list[int]] = {}            # tenant -> [shed, shed and late, late unshed]
    for r in on:
        row = rows.setdefault(r["tenant"], [0, 0, 0])
        late = waited_past(unshed[r["request_id"]])
        if shed(r):
            row[0] += 1
            row[1] += late
        row[2] += late
    total = [sum(v[i] for v in rows.values()) for i in range(3)]
    return {"shed": total[0], "shed_and_late": total[1], "late_unshed": total[2],
            "precision": _ratio(total[1], total[0]), "recall": _ratio(total[1], total[2]),
            "tenants": {t: {"shed": v[0], "precision": _ratio(v[1], v[0]), "recall": _ratio(v[1], v[2])}
                        for t, v in sorted(rows.items()) if v[0] or v[2]}}


def without_shedding(contract: Contract) -> Contract:
    adm = contract.admission.model_copy(update={"shed_over_max_wait": False})
    return contract.model_copy(update={"admission": adm})


def runs_on_off(workload: Workload, contract: Contract, profile: Profile, policy: str = "fair") -> dict:
    """``policy`` on ``workload`` with shedding as the contract says (``"on"``) and off
    (``"off"``): label -> ``simulate``'s output, without isolated baselines."""
    from ..sim.simulate import simulate
    return {label: simulate(workload, policy, c, profile, isolated=False)
            for label, c in (("on", contract), ("off", without_shedding(contract)))}


def bench_shedding(workload: Workload, contract: Contract, profile: Profile, policy: str = "fair") -> dict:
    """Both runs of ``policy`` (shedding as the contract says, and off) and the scores."""
    runs = {}
    for label, res in runs_on_off(workload, contract, profile, policy).items():
        s = res.summary
        runs[label] = (res.records, {"finished_tokens": s["finished_tokens"],
                                     "in_time_tokens": s["goodput"]["in_time_tokens"],
                                     "slo_tokens": s["goodput"]["slo_tokens"], "outcomes": s["outcomes"],
                                     "starvation_events": s["starvation_events"],
                                     "overdue_requests": s["overdue_requests"]})
    return {"workload": workload.name, "policy": policy, "shedding_default": contract.admission.shed_over_max_wait,
            **shedding_scores(runs["on"][0], runs["off"][0]),
            "on": runs["on"][1], "off": runs["off"][1]}
