"""Which requests ``fair`` shed that the engine would have served in time, on the random
mixes of ``scripts/outside_acceptance.py`` (or a built-in scenario's seeds).

Each mix runs twice under ``fair``, with the contract's load shedding and with it off (the
counterfactual of ``evaluation/shedding.py``).  A shed request is *wrongly shed* when, unshed,
it started within its max wait.  For each (tenant, class) with wrongly shed requests the
script prints how many were shed and how many of them wrongly, their arrivals, the forecast
wait they were shed for against the limit it exceeded (both from the ``overloaded`` reason:
at arrival, the max wait; at the queue's review, the rest of it, ``sched/fair/review.py``),
and their waits unshed.  Each wrongly shed request is put in one kind:

* ``arrivals end``: the workload's last arrival came after it was shed and within its max
  wait, so the load the forecast extrapolated could stop before its wait was over;
* ``just over``: else its forecast was at most ``JUST_OVER`` x its limit;
* ``well over``: the rest.

Each kind is split by where the request was shed: ``at arrival`` or ``at review`` (from the
queue, as its max wait neared).  The summary counts the mixes whose shedding precision is
under the acceptance minimum and their wrongly shed requests by kind.

    python scripts/shed_misses.py [--seeds 0-59] [--scenario NAME] [--profile NAME]
"""
import argparse
import re
from collections import Counter
from typing import Final, NamedTuple

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import Profile, load_profile, profile_arg
from tokenfair.evaluation.acceptance import MIN_SHED_PRECISION
from tokenfair.evaluation.shedding import runs_on_off, shed, wait_s, waited_past
from tokenfair.workloads.random_mix import random_mix, seed_range_arg
from tokenfair.workloads.scenarios import SCENARIOS, build_scenario
from tokenfair.workloads.workload import Workload

JUST_OVER: Final = 1.25           # a forecast up to this many times its limit: just over it
# the forecast and its limit in an ``overloaded`` reason (sched/fair/forecast.py,
# WaitForecaster.shed_reason; sched/fair/review.py, QueueReview.judge)
FORECAST: Final = re.compile(r"predicted wait ([0-9.]+)s(?: more)? exceeds ([0-9.]+)s")


class Shed(NamedTuple):
    """One shed request, and what it did with shedding off."""
    arrival_s: float
    shed_s: float                     # when it was shed (its arrival, or its review)
    forecast_s: float                 # the wait it was shed for
    limit_s: float                    # what that forecast exceeded
    unshed_wait_s: float | None       # with shedding off (None: it never ran nor ended)
    max_wait_s: float
    late: bool                        # with shedding off it waited past its max wait


def forecast_of(reason: str) -> tuple[float, float]:
    """The forecast wait an ``overloaded`` reason gives, and the limit it exceeded."""
    m = FORECAST.search(reason)
    if m is None:
        raise ValueError(f"no forecast in the reason {reason!r}")
    return float(m[1]), float(m[2])


def kind_of(x: Shed, last_arrival_s: float) -> str:
    """The kind of a wrongly shed request (module docstring)."""
    if x.shed_s <= last_arrival_s < x.arrival_s + x.max_wait_s:
        return "arrivals end"
    return "just over" if x.forecast_s <= JUST_OVER * x.limit_s else "well over"


def where_of(x: Shed) -> str:
    """Where a shed request was shed: at its arrival, or from the queue at a review."""
    return "at arrival" if x.shed_s == x.arrival_s else "at review"


def shed_groups(wl: Workload, contract: Contract,
                profile: Profile) -> tuple[int, int, dict[tuple[str, str], list[Shed]]]:
    """(shed, of them waited past their max wait unshed, (tenant, class) -> its shed requests)."""
    runs = runs_on_off(wl, contract, profile)
    off = {r["request_id"]: r for r in runs["off"].records}
    groups: dict[tuple[str, str], list[Shed]] = {}
    for r in runs["on"].records:
        if shed(r):
            u = off[r["request_id"]]
            groups.setdefault((r["tenant"], r["class"]), []).append(
                Shed(r["arrival_s"], r["finish_s"], *forecast_of(r["reason"]), wait_s(u), r["max_wait_s"],
                     waited_past(u)))
    entries = [x for xs in groups.values() for x in xs]
    return len(entries), sum(x.late for x in entries), groups


def _range(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=seed_range_arg, default="0-59", help="a seed or a range LO-HI")
    ap.add_argument("--scenario", default=None, choices=SCENARIOS,
                    help="a built-in scenario's seeds instead of the random mixes")
    ap.add_argument("--profile", type=profile_arg, default=None)
    a = ap.parse_args()
    profile = load_profile(a.profile)
    kinds: Counter[str] = Counter()
    missed = []
    for seed in a.seeds:
        wl, contract = build_scenario(a.scenario, seed) if a.scenario else random_mix(seed)[:2]
        num_shed, num_late, groups = shed_groups(wl, contract, profile)
        if num_late == num_shed:
            continue
        last = max(r.arrival_s for r in wl.rows)
        precision = num_late / num_shed
        mine = Counter(f"{kind_of(x, last)} {where_of(x)}" for xs in groups.values() for x in xs if not x.late)
        print(f"seed {seed}: shed {num_shed}, precision {precision:.0%}, last arrival {last:.1f} s; wrongly shed: "
              + ", ".join(f"{kind} {k}" for kind, k in mine.most_common()), flush=True)
        for (tenant, klass), xs in groups.items():
            wrong = [x for x in xs if not x.late]
            if not wrong:
                continue
            print(f"  {tenant} {klass} (max wait {wrong[0].max_wait_s:g} s): {len(wrong)} of {len(xs)} shed wrongly; "
                  f"arrivals {_range([x.arrival_s for x in wrong])} s, "
                  f"forecast {_range([x.forecast_s for x in wrong])} s against {_range([x.limit_s for x in wrong])} s, "
                  f"unshed wait {_range([x.unshed_wait_s for x in wrong])} s")
        if precision < MIN_SHED_PRECISION:
            missed.append(seed)
            kinds.update(mine)
    n = sum(kinds.values())
    print(f"\n{len(missed)} seeds with shedding precision under {MIN_SHED_PRECISION:.0%}"
          f"{': ' + ', '.join(map(str, missed)) if missed else ''}; their {n} wrongly shed requests by kind:")
    for kind, k in kinds.most_common():
        print(f"  {kind}: {k} ({k / n:.0%})")


if __name__ == "__main__":
    main()
