"""Capacity planning: the fewest replicas that keep every tenant's P99 TTFT under a target.

    python scripts/capacity_plan.py WORKLOAD --target-p99-ttft 2.0 [--replicas 1,2,4,8,16]
        [--policy vtc] [--router least-loaded] [--fleet-policy none|fair] [--prefix-cache]
        [--spread-tenants N] [--rate-scale X] [--max-requests N] [--seed 0]

For each replica count N (ascending) the workload is simulated on N replicas (``tokenfair
simulate --replicas N``, isolated baselines off) and one line printed: finished / rejected
requests, throughput, the worst tenant's P99 TTFT and which tenant, mean utilisation; the sweep
stops at the first N whose worst tenant meets the target with nothing rejected.
"""

from __future__ import annotations

import argparse

from tokenfair.cli.common import resolve_contract, resolve_workload, shape_workload
from tokenfair.core.costmodel import load_profile
from tokenfair.sim.fleet import FleetConfig
from tokenfair.sim.fleet_simulate import simulate_fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload")
    ap.add_argument("--target-p99-ttft", type=float, required=True, help="seconds, for every tenant")
    ap.add_argument("--replicas", default="1,2,4,8,16")
    ap.add_argument("--policy", default="vtc")
    ap.add_argument("--router", default="least-loaded")
    ap.add_argument("--fleet-policy", default="none")
    ap.add_argument("--prefix-cache", action="store_true")
    ap.add_argument("--spread-tenants", type=int, default=None)
    ap.add_argument("--rate-scale", type=float, default=None)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    wl, default_contract = resolve_workload(args.workload, args.seed)
    wl = shape_workload(wl, rate_scale=args.rate_scale, spread_tenants=args.spread_tenants,
                        max_requests=args.max_requests, seed=args.seed)
    contract = resolve_contract(None, default_contract)
    profile = load_profile(None)
    print(f"{args.workload}: {len(wl.rows)} requests, {len(wl.tenants)} tenants; target: every tenant's "
          f"P99 TTFT <= {args.target_p99_ttft:g} s; policy {args.policy}, router {args.router}, "
          f"fleet policy {args.fleet_policy}, profile {profile.name}")
    for n in [int(x) for x in args.replicas.split(",")]:
        cfg = FleetConfig(num_replicas=n, router=args.router, fleet_policy=args.fleet_policy,
                          prefix_cache=args.prefix_cache)
        s = simulate_fleet(wl, args.policy, contract, profile, cfg, isolated=False).summary
        worst_t, worst = max(((t, m["ttft_s"]["p99"]) for t, m in s["tenants"].items()
                              if m["ttft_s"]["p99"] is not None), key=lambda x: (x[1], x[0]))
        rejected = s["status"].get("rejected", 0)
        ok = worst <= args.target_p99_ttft and rejected == 0
        print(f"replicas={n:>3}  finished={s['status'].get('finished', 0)} rejected={rejected}  "
              f"throughput={s['throughput_tokens_per_s']:.0f} tok/s  worst tenant P99 TTFT={worst:.2f} s ({worst_t})  "
              f"utilisation={s['fleet']['mean_utilisation']:.2f}  {'meets the target' if ok else 'misses'}",
              flush=True)
        if ok:
            print(f"=> {n} replicas")
            return
    print("=> none of the replica counts tried meets the target")


if __name__ == "__main__":
    main()
