"""Fleet comparison on Mooncake's conversation trace (or another trace with prefix hashes):
four ways to run N replicas.

    python scripts/fleet_compare.py [--replicas 8] [--tenants 20] [--rate-scale 1.0]
                                    [--max-requests N] [--seed 0] [--cache-tokens N] [--gateway-window N]
                                    [--workload mooncake|mooncake:synthetic]

  prefix+gateway  prefix-aware router (load bound 1.5), the fair gateway in front, FIFO per replica
  prefix+gateway+hold  the same, and a request waits up to 2 s (``--locality-hold``) for the
                  replica holding half or more of its prompt when that replica has no room
  rr+vtc          round-robin router, VTC per replica (each replica its own counters)
  dlpm-style      locality first (prefix-aware, load bound 4), VTC per replica: DLPM's
                  "deficit counters x longest prefix match" approximated by prefix placement
                  plus per-replica VTC deficits (not DLPM's in-queue prefix ordering)

Every configuration has a prefix cache per replica (Mooncake's 512-token ``hash_ids``) and the
same contract: the default classes with load shedding off, so no configuration can buy its
figures by refusing work (rejections are printed anyway).  Tenants: requests spread over
``--tenants`` Zipf-skewed tenants; *light* tenants are the half with the fewest requests.
Prints a markdown table: throughput (prompt + output tokens per second of makespan), cache hit
rate, Jain's index (min over backlogged 60 s windows), the light tenants' worst P99 TTFT, P99
TTFT overall, rejections.
"""

from __future__ import annotations

import argparse
import time

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.sim.fleet import FleetConfig
from tokenfair.sim.fleet_simulate import simulate_fleet
from tokenfair.workloads.traces import limit, load_workload, scale_rate

CONFIGS = {
    "prefix+gateway": ("fifo", dict(router="prefix-aware", fleet_policy="fair", load_bound=1.5)),
    "prefix+gateway+hold": ("fifo", dict(router="prefix-aware", fleet_policy="fair", load_bound=1.5,
                                         locality_hold_s=2.0)),
    "rr+vtc": ("vtc", dict(router="round-robin")),
    "dlpm-style": ("vtc", dict(router="prefix-aware", load_bound=4.0)),
}


def _fmt(v, spec="{:.3f}"):
    return "-" if v is None else spec.format(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mooncake", help="a trace with prefix hashes (default: mooncake)")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--gateway-window", type=int, default=None,
                    help="prefix+gateway: a fixed window per replica (default: the gateway's saturation-driven one)")
    ap.add_argument("--cache-tokens", type=int, default=None,
                    help="prefix cache per replica in tokens (default: the replica's KV capacity)")
    ap.add_argument("--locality-hold", type=float, default=None,
                    help="prefix+gateway+hold: seconds a request may wait for the replica holding its prefix "
                         "(default 2)")
    args = ap.parse_args()
    wl = load_workload(args.workload, seed=args.seed, num_tenants=args.tenants)
    if args.rate_scale != 1.0:
        wl = scale_rate(wl, args.rate_scale)
    if args.max_requests:
        wl = limit(wl, args.max_requests)
    contract = parse_contract({"admission": {"shed_over_max_wait": False}})
    profile = load_profile(None)
    counts = {t: sum(1 for r in wl.rows if r.tenant == t) for t in wl.tenants}
    light = sorted(counts, key=lambda t: (counts[t], t))[: len(counts) // 2]
    print(f"{args.workload}, {len(wl.rows)} requests, {len(counts)} tenants, rate x{args.rate_scale}, "
          f"{args.replicas} replicas, profile {profile.name}; light tenants: {', '.join(light)}")
    print("| configuration | throughput tok/s | cache hit rate | Jain min | light P99 TTFT worst (s) "
          "| P99 TTFT (s) | routing imbalance | rejected | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.configs.split(","):
        policy, opts = CONFIGS[name]
        if opts.get("fleet_policy") == "fair":
            opts = {**opts, "gateway_window": args.gateway_window}
        if "locality_hold_s" in opts and args.locality_hold is not None:
            opts = {**opts, "locality_hold_s": args.locality_hold}
        cfg = FleetConfig(num_replicas=args.replicas, prefix_cache=True, cache_tokens=args.cache_tokens, **opts)
        t0 = time.perf_counter()
        s = simulate_fleet(wl, policy, contract, profile, cfg, isolated=False).summary
        wall = time.perf_counter() - t0
        f = s["fleet"]
        lp99 = [s["tenants"][t]["ttft_s"]["p99"] for t in light if t in s["tenants"]]
        lp99 = [v for v in lp99 if v is not None]
        print(f"| {name} | {s['throughput_tokens_per_s']:.0f} | {_fmt(f['cache_hit_rate'])} | "
              f"{_fmt(s['fairness']['jain_min'])} | {_fmt(max(lp99) if lp99 else None, '{:.2f}')} | "
              f"{_fmt(s['overall']['ttft_s']['p99'], '{:.2f}')} | {_fmt(f['routing_imbalance'], '{:.2f}')} | "
              f"{s['status'].get('rejected', 0)} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
