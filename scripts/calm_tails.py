"""What fair does to each tenant's P99 TTFT where nothing is overloaded, on the random mixes of
``scripts/outside_acceptance.py``.

A mix is *calm* when under each of fair, fifo and vtc every request finished and got its
first token within its class's max wait: the three do the same work in time and differ only
in order.  For every tenant of a calm mix, fair's P99 TTFT is put over the better (lower) of
fifo's and vtc's.  Printed: each tenant whose ratio is over ``--ratio`` (the better baseline's
P99 at least ``--min-s``), with how many of its requests were late (TTFT over that baseline
P99) and how many of those waited mostly held by the *slot headroom*: a slot was free, but
the slots kept for the tenants within their share (``sched/fair/headroom.py``) held its tenant,
which was past its own share and not light; then the geometric mean of the ratios and how
many were over, for the calm tenants (and the light ones among them).

    python scripts/calm_tails.py [--seeds 0-59] [--ratio 1.2] [--min-s 0.05] [--jobs N]

The attribution reruns fair with every step scheduled one at a time (its records equal the
fast run's, ``tests/test_fastforward.py``) and reads the fair policy's headroom after each
step.
"""
import argparse
import bisect
import math
from multiprocessing import Pool
from typing import Any, NamedTuple

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import Profile, load_profile
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.runtime.step_counter import StepCounter
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.random_mix import random_mix, seed_range_arg
from tokenfair.workloads.workload import Workload

POLICIES = ("fair", "fifo", "vtc")


class TenantTail(NamedTuple):
    tenant: str
    light: bool
    ratio: float                  # fair's P99 TTFT / the better baseline's
    fair_p99: float
    best_p99: float
    late: int                     # its requests with TTFT over best_p99 under fair
    held: int                     # of them, waiting mostly held by the slot headroom


class HeldLog(IterationScheduler):
    """The fair scheduler, noting after each step which waiting tenants the slot headroom
    held while a slot was free (module docstring): ``held[i]`` for the step at ``starts[i]``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.starts: list[float] = []
        self.held: list[frozenset[str]] = []

    def schedule(self, now: float):
        out = super().schedule(now)
        policy, n = self.policy, len(self.running)
        held = set()
        if n < self.max_running:
            for t in policy.roster.tenants.values():
                if t.num_waiting and policy.headroom.holds_slot(t, n, policy.meter, now):
                    held.add(t.name)
        self.starts.append(now)
        self.held.append(frozenset(held))
        return out


def held_by_headroom(wl: Workload, contract: Contract, profile: Profile,
                     late: dict[str, set[str]]) -> dict[str, int]:
    """tenant -> how many of its ``late`` requests (ids) waited mostly (half their steps or
    more between arrival and admission) with their tenant held by the slot headroom."""
    sched = HeldLog(make_policy("fair"), contract, profile)
    res = run(wl.rows, contract, sched, RowFedEngine(SimEngine(profile)), VirtualClock(),
              recorder=StepCounter(contract.costs))
    counts = {t: 0 for t in late}
    for r in res.requests:
        if r.request_id not in late.get(r.tenant, ()):
            continue
        waited = sched.held[bisect.bisect_left(sched.starts, r.arrival_s):
                            bisect.bisect_left(sched.starts, r.scheduled_s)]
        if waited and 2 * sum(r.tenant in h for h in waited) >= len(waited):
            counts[r.tenant] += 1
    return counts


def calm_mix(seed: int, ratio: float, min_s: float) -> tuple[bool, list[TenantTail]]:
    """(is mix ``seed`` calm?, every tenant's tail if so, else [])."""
    wl, contract, light = random_mix(seed)
    profile = load_profile(None)
    runs = {p: simulate(wl, p, contract, profile, isolated=False) for p in POLICIES}
    for out in runs.values():
        for r in out.records:
            max_wait = r["max_wait_s"]
            if r["status"] != "finished" or (max_wait is not None
                                             and r["first_token_s"] - r["arrival_s"] > max_wait):
                return False, []
    tails, late = [], {}
    ttft = {r["request_id"]: r["first_token_s"] - r["arrival_s"] for r in runs["fair"].records}
    for t, m in runs["fair"].summary["tenants"].items():
        best = min(runs[p].summary["tenants"][t]["ttft_s"]["p99"] for p in POLICIES[1:])
        fair_p99 = m["ttft_s"]["p99"]
        tails.append(TenantTail(t, t in light, fair_p99 / best, fair_p99, best, 0, 0))
        if fair_p99 > ratio * best and best >= min_s:
            late[t] = {r["request_id"] for r in runs["fair"].records
                       if r["tenant"] == t and ttft[r["request_id"]] > best}
    held = held_by_headroom(wl, contract, profile, late) if late else {}
    return True, [x._replace(late=len(late[x.tenant]), held=held[x.tenant]) if x.tenant in late else x
                  for x in tails]


def _one(args: tuple[int, float, float]) -> tuple[int, bool, list[TenantTail]]:
    seed, ratio, min_s = args
    return (seed, *calm_mix(seed, ratio, min_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=seed_range_arg, default=seed_range_arg("0-59"))
    ap.add_argument("--ratio", type=float, default=1.2, help="flag a tenant whose ratio is over this")
    ap.add_argument("--min-s", type=float, default=0.05, help="... and whose better baseline P99 is at least this")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    if not a.ratio > 0 or not a.min_s >= 0 or a.jobs < 1:
        ap.error("--ratio must be > 0, --min-s >= 0 and --jobs >= 1")
    jobs = [(s, a.ratio, a.min_s) for s in a.seeds]
    if a.jobs > 1:
        with Pool(a.jobs) as pool:
            results = pool.map(_one, jobs)
    else:
        results = [_one(j) for j in jobs]
    ratios, num_calm = [], 0
    for seed, calm, tails in results:
        num_calm += calm
        for x in tails:
            ratios.append((x.ratio, x.light, x.best_p99 >= a.min_s))
            if x.late:
                print(f"mix {seed}: {x.tenant}{' (light)' if x.light else ''} P99 TTFT {x.fair_p99:.3f} s, "
                      f"{x.ratio:.2f}x the better baseline's {x.best_p99:.3f} s; {x.late} late requests, "
                      f"{x.held} of them held mostly by the slot headroom")
    print(f"\n{num_calm} of {len(results)} mixes calm; {len(ratios)} tenants in them")
    for label, sel in (("every tenant", ratios), ("light tenants", [r for r in ratios if r[1]])):
        if sel:
            gm = math.exp(sum(math.log(r) for r, _, _ in sel) / len(sel))
            over = sum(1 for r, _, counted in sel if r > a.ratio and counted)
            print(f"  {label}: {len(sel)}; fair's P99 / the better baseline's, geometric mean {gm:.3f}; "
                  f"over {a.ratio:g}x (the better baseline's P99 at least {a.min_s:g} s): {over}")


if __name__ == "__main__":
    main()
