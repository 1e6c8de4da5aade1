"""Where the light tenants' slow first tokens come from, on the random mixes of
``scripts/outside_acceptance.py`` (or a built-in scenario's seeds), under ``fair``.

For every light tenant whose P99 TTFT is over ``2 x`` its isolated P99 (its traffic alone
under the same contract, on the isolated baselines' reference scheduler: ``sim/simulate.py``),
each of its *late* requests (TTFT over that bound) is
put in one part, the largest of three:

* ``step in flight``: from its arrival to the start of the next step (no step is cut short);
* waiting while steps run without it, named by what held most of those steps: ``slots full``
  (``max_running`` reached), ``prefill budget`` (75% or more of the contract's prefill
  budget used), ``KV`` (90% or more of the pool held), else ``order`` (the policy put other
  work first);
* its own prefill: ``prefill split`` (more steps than alone at the full budget: the budget
  was shared or shaped), ``prefill step`` (one step, long with the others' work in it),
  ``prefill as alone`` (as many steps as alone).

Each tenant is also marked when it asked for more than its share in some ``--window-s``
window in which the engine was saturated (requests waiting in ``SATURATED`` of its buckets):
the cost of its requests arriving in the window (the contract's token costs) over its share
of the cost served in it, shared by weighted water filling among what each tenant asked in
the window or still had queued from before.  Over 1, the contract itself gives it less than
it asks while the others are backlogged.

    python scripts/light_misses.py [--seeds 0-59] [--scenario NAME] [--window-s 20]

One run per seed, every step scheduled one at a time (no decode runs applied at once) so
each step's start is seen; its records equal the fast run's (``tests/test_fastforward.py``),
and its summary is ``simulate``'s (``sim/simulate.run_summary``).
"""
import argparse
import bisect
from collections import Counter
from typing import Any, Final

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import Profile, load_profile, profile_arg
from tokenfair.evaluation.record_table import RecordTable
from tokenfair.evaluation.acceptance import LIGHT, MAX_LIGHT_VS_ISOLATED
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.runtime.recorder import Recorder
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import RowFedEngine, SimEngine
from tokenfair.sim.simulate import run_summary
from tokenfair.workloads.random_mix import random_mix, seed_range_arg
from tokenfair.workloads.scenarios import SCENARIOS, build_scenario
from tokenfair.workloads.workload import Workload

BUDGET_USED: Final = 0.75         # a step with this fraction of the prefill budget: budget-bound
KV_FULL: Final = 0.9              # a step with this KV usage: KV-bound
SATURATED: Final = 0.9            # a window with requests waiting in this fraction of it
ABOVE_SHARE: Final = 0.99         # asked / share above this: asks more than its share
MAX_ISOLATED_TENANTS: Final = 32  # simulate()'s default: the smallest tenants get isolated runs


class StepLog(IterationScheduler):
    """The scheduler, noting each step: (start, running, max_running, prefill tokens, KV usage)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.steps: list[tuple[float, int, int, int, float]] = []

    def schedule(self, now: float):
        out = super().schedule(now)
        self.steps.append((now, len(self.running), self.max_running, out.num_prefill_tokens, self.pool.usage))
        return out


def stepped_run(wl: Workload, contract: Contract, profile: Profile) -> tuple[dict, dict, list, list[tuple]]:
    """(summary.json with isolated baselines, the timeline, the requests, the steps) of ``fair``
    on ``wl``, every step through ``schedule``: ``simulate``'s run and summary, the steps seen."""
    sched = StepLog(make_policy("fair"), contract, profile)
    engine = SimEngine(profile)
    res = run(wl.rows, contract, sched, RowFedEngine(engine), VirtualClock(), recorder=Recorder(contract.costs))
    timeline = res.recorder.to_json()
    timeline["swap_s"] = engine.swap_s
    summary = run_summary(wl, "fair", contract, profile, RecordTable.from_requests(res.requests), timeline,
                          sched, res.wall_s, True, MAX_ISOLATED_TENANTS)
    return summary, timeline, res.requests, sched.steps


def part_of(rec: Any, steps: list[tuple], starts: list[float], budget: int) -> str:
    """The largest part of a late request's TTFT (module docstring); ``rec``: its Request."""
    a, s, f = rec.arrival_s, rec.scheduled_s, rec.first_token_s
    i = bisect.bisect_right(starts, a)                 # the first step after its arrival
    j = bisect.bisect_left(starts, s)                  # the step that admitted it
    k = bisect.bisect_left(starts, f)                  # the first step after its first token
    nxt = starts[i] if i < len(starts) else s
    in_flight, waited, own = max(0.0, min(nxt, s) - a), max(0.0, s - max(nxt, a)), f - s
    if in_flight >= max(waited, own):
        return "step in flight"
    if waited >= own:
        held = steps[i:j]
        half = len(held) / 2
        if sum(1 for st in held if st[1] >= st[2]) >= half:
            return "slots full"
        if sum(1 for st in held if st[3] >= BUDGET_USED * budget) >= half:
            return "prefill budget"
        return "KV" if sum(1 for st in held if st[4] >= KV_FULL) >= half else "order"
    alone_steps = -(-rec.prompt_tokens // budget)
    return "prefill split" if k - j > alone_steps else "prefill step" if k - j == 1 else "prefill as alone"


def water_level(asked: dict[str, float], weight: dict[str, float], served: float) -> float:
    """The level ``L`` with ``sum_t min(asked_t, weight_t * L) = served`` (inf: all fit)."""
    if sum(asked.values()) <= served:
        return float("inf")
    lo, hi = 0.0, max(asked[t] / weight[t] for t in asked)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(asked[t], weight[t] * mid) for t in asked) <= served else (lo, mid)
    return lo


def asked_over_share(wl: Workload, contract: Contract, timeline: dict, window_s: float) -> dict[str, float]:
    """Each tenant's largest (cost arriving in a window) / (its water-filled share of the cost
    served in that window), over the *saturated* windows (requests waited in at least
    ``SATURATED`` of its buckets).  The water level shares what was served among what each
    tenant asked in the window and still had queued from before (module docstring)."""
    costs, bucket_s = contract.costs, timeline["bucket_s"]
    per_window = max(1, round(window_s / bucket_s))
    served: dict[int, Counter[str]] = {}
    for t, per_bucket in timeline["tenant_service"].items():
        for k, v in per_bucket.items():
            served.setdefault(int(k) // per_window, Counter())[t] += v
    arrived: dict[int, Counter[str]] = {}
    for r in wl.rows:
        cost = costs.prefill_token * r.prompt_tokens + costs.decode_token * r.output_tokens
        arrived.setdefault(int(r.arrival_s // bucket_s) // per_window, Counter())[r.tenant] += cost
    queued: Counter[int] = Counter(int(k) // per_window for k, n in timeline["queue_len"].items() if n > 0)
    carried: Counter[str] = Counter()             # asked before the window and not yet served
    worst: Counter[str] = Counter()
    for b in range(max(arrived) + 1):
        now = arrived.get(b, Counter())
        demand = {t: carried[t] + now[t] for t in set(carried) | set(now) if carried[t] + now[t] > 0}
        done = served.get(b, Counter())
        if demand and queued[b] >= SATURATED * per_window:
            level = water_level(demand, {t: contract.tenant(t).weight for t in demand}, sum(done.values()))
            if level != float("inf"):
                for t, v in now.items():
                    worst[t] = max(worst[t], v / (contract.tenant(t).weight * level))
        for t in demand:
            carried[t] = max(0.0, demand[t] - done[t])
    return worst


def misses(wl: Workload, contract: Contract, light: tuple[str, ...], profile: Profile,
           window_s: float) -> list[tuple[str, float, bool, Counter[str]]]:
    """(tenant, P99 / isolated P99, asks more than its share, its late requests by part) for
    each light tenant over the bound."""
    summary, timeline, requests, steps = stepped_run(wl, contract, profile)
    over = asked_over_share(wl, contract, timeline, window_s)
    starts = [st[0] for st in steps]
    budget = contract.engine.prefill_token_budget
    found = []
    for t in light:
        figures = summary["tenants"].get(t, {})
        ratio = figures.get("ttft_p99_vs_isolated")
        if ratio is None or ratio <= MAX_LIGHT_VS_ISOLATED:
            continue
        bound = MAX_LIGHT_VS_ISOLATED * figures["isolated"]["ttft_s"]["p99"]
        parts = Counter(part_of(r, steps, starts, budget) for r in requests
                        if r.tenant == t and r.first_token_s is not None and r.first_token_s - r.arrival_s > bound)
        found.append((t, ratio, over[t] > ABOVE_SHARE, parts))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=seed_range_arg, default="0-59", help="a seed or a range LO-HI")
    ap.add_argument("--scenario", default=None, choices=SCENARIOS,
                    help="a built-in scenario's seeds instead of the random mixes")
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--profile", type=profile_arg, default=None)
    a = ap.parse_args()
    profile = load_profile(a.profile)
    totals = {False: Counter(), True: Counter()}
    num_tenants: Counter[bool] = Counter()
    for seed in a.seeds:
        if a.scenario:
            wl, contract = build_scenario(a.scenario, seed)
            light = LIGHT.get(a.scenario, ())
        else:
            wl, contract, light = random_mix(seed)
        found = misses(wl, contract, light, profile, a.window_s)
        for t, ratio, over, parts in found:
            num_tenants[over] += 1
            totals[over].update(parts)
        if found:
            print(f"seed {seed}: " + "; ".join(
                f"{t} {ratio:.1f}x{' (asks over its share)' if over else ''}: "
                + ", ".join(f"{p} {n}" for p, n in parts.most_common()) for t, ratio, over, parts in found), flush=True)
    for over in (False, True):
        n = sum(totals[over].values())
        print(f"\n{num_tenants[over]} light tenants over {MAX_LIGHT_VS_ISOLATED:g}x isolated that "
              f"{'ask more than' if over else 'stay within'} their share; their {n} late requests by part:")
        for p, k in totals[over].most_common():
            print(f"  {p}: {k} ({k / n:.0%})")


if __name__ == "__main__":
    main()
