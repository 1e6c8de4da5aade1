"""The fair policy's acceptance on the built-in scenarios, against fifo and vtc in one run.

Per scenario: fifo, vtc and fair on the same workload (fair with isolated per-tenant runs
for the light tenants' slowdown), and fair again with load shedding off for the shedding
counterfactual (``shedding.py``).  The criteria, each a :class:`Criterion`:

* in-time goodput: fair's >= the best baseline's;
* zero starvation events; the longest service gap of any tenant <= vtc's (gaps under
  ``metrics.BACKLOG_GRACE_S``, a few engine steps, are not backlog: they compare as equal);
* weighted Jain over 60 s windows among tenants backlogged together >= ``MIN_JAIN`` where
  such windows exist;
* the light tenants' P99 TTFT <= vtc's and <= ``MAX_LIGHT_VS_ISOLATED`` x isolated;
* shedding precision >= ``MIN_SHED_PRECISION`` wherever fair sheds;
* recovery cost < ``MAX_RECOVERY``; every request in exactly one terminal state.
``scripts/acceptance.py`` prints them (the README's table); ``tests/test_acceptance.py``
checks them with margins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from .goodput import vs_baseline
from .metrics import BACKLOG_GRACE_S
from ..workloads.scenarios import build_scenario
from ..workloads.transforms import scale_rate
from ..workloads.workload import Workload
from .shedding import shedding_scores, without_shedding

BASELINES: Final = ("fifo", "vtc")
MIN_JAIN: Final = 0.98
MAX_LIGHT_VS_ISOLATED: Final = 2.0
MIN_SHED_PRECISION: Final = 0.9
MAX_RECOVERY: Final = 0.05
TERMINAL: Final = frozenset({"finished", "rejected", "expired", "failed", "aborted"})

# tenants that ask for less than their share, whose latency the fair policy protects
LIGHT: Final = {
    "hol": ("chat",),
    "whale": ("small-0", "small-1", "small-2", "small-3"),
    "burst": ("stream",),
    "burst-long": tuple(f"stream-{k}" for k in range(6)),
}


@dataclass(frozen=True)
class Criterion:
    name: str
    value: float | None       # fair's figure (None: does not apply)
    limit: float | None       # what it is compared with
    passed: bool
    detail: str = ""


def _light_ttft(fair: dict, vtc: dict, tenants: tuple[str, ...]) -> tuple[list[Criterion], str]:
    """The light tenants' criteria, and a line naming the worst of them (by x isolated)."""
    out: list[Criterion] = []
    worst: tuple[float, str] | None = None
    for t in tenants:
        p99, v99 = fair["tenants"][t]["ttft_s"]["p99"], vtc["tenants"][t]["ttft_s"]["p99"]
        iso = fair["tenants"][t].get("ttft_p99_vs_isolated")
        out.append(Criterion("light P99 TTFT <= vtc", p99, v99, p99 is not None and v99 is not None and p99 <= v99, t))
        out.append(Criterion("light P99 TTFT <= 2x isolated", iso, MAX_LIGHT_VS_ISOLATED,
                             iso is not None and iso <= MAX_LIGHT_VS_ISOLATED, t))
        if iso is not None and (worst is None or iso > worst[0]):
            worst = (iso, f"{t} {p99:.2f}s = {iso:.2f}x isolated (vtc {v99:.2f}s)")
    text = "" if worst is None else (f"worst of {len(tenants)}: {worst[1]}" if len(tenants) > 1 else worst[1])
    return out, text


def evaluate_scenario(name: str, profile: Profile, seed: int = 0, rate_scale: float = 1.0) -> dict:
    """Every run's summary, the shedding scores and the criteria for scenario ``name``
    (``rate_scale``: its arrivals compressed in time by this factor, the same requests)."""
    wl, contract = build_scenario(name, seed)
    if rate_scale != 1.0:
        wl = scale_rate(wl, rate_scale)
    return evaluate_workload(name, wl, contract, profile, LIGHT.get(name, ()))


def evaluate_workload(name: str, wl: Workload, contract: Contract, profile: Profile,
                      light: tuple[str, ...]) -> dict:
    """:func:`evaluate_scenario` for any workload and contract; ``light``: the tenants whose
    P99 TTFT is held to vtc's and to ``MAX_LIGHT_VS_ISOLATED`` x isolated."""
    from ..sim.simulate import simulate
    runs = {p: simulate(wl, p, contract, profile, isolated=False) for p in BASELINES}
    runs["fair"] = simulate(wl, "fair", contract, profile, isolated=bool(light))
    unshed = simulate(wl, "fair", without_shedding(contract), profile, isolated=False)
    fair, vtc = runs["fair"].summary, runs["vtc"].summary
    for p in ("vtc", "fair"):
        runs[p].summary["vs_fifo"] = vs_baseline(runs[p].records, runs["fifo"].records)
    shed = shedding_scores(runs["fair"].records, unshed.records)
    best = max(BASELINES, key=lambda p: runs[p].summary["goodput"]["in_time_tokens"])
    intime, best_intime = fair["goodput"]["in_time_tokens"], runs[best].summary["goodput"]["in_time_tokens"]
    jain = fair["fairness"]["jain_min"]
    crit = [
        Criterion("in-time goodput >= best baseline", intime, best_intime, intime >= best_intime, best),
        Criterion("starvation events", fair["starvation_events"], 0, fair["starvation_events"] == 0),
        Criterion("longest service gap <= vtc", fair["longest_service_gap_s"], vtc["longest_service_gap_s"],
                  fair["longest_service_gap_s"] <= max(vtc["longest_service_gap_s"], BACKLOG_GRACE_S)),
        Criterion("Jain among backlogged", jain, MIN_JAIN, jain is None or jain >= MIN_JAIN),
        Criterion("shedding precision", shed["precision"], MIN_SHED_PRECISION,
                  shed["precision"] is None or shed["precision"] >= MIN_SHED_PRECISION),
        Criterion("recovery cost", fair["recovery_cost_fraction"], MAX_RECOVERY,
                  fair["recovery_cost_fraction"] < MAX_RECOVERY),
        Criterion("one terminal state each", len(runs["fair"].records), len(wl.rows),
                  len(runs["fair"].records) == len(wl.rows)
                  and all(r["status"] in TERMINAL and r["reason"] for r in runs["fair"].records)),
    ]
    light_crit, light_text = _light_ttft(fair, vtc, light)
    return {"scenario": name, "requests": len(wl.rows), "summaries": {p: r.summary for p, r in runs.items()},
            "shedding": shed, "criteria": crit + light_crit, "light_text": light_text}
