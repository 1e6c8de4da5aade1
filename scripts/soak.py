"""The fault-injecting soak (tokenfair.benchmarks.soak) at full size; prints one JSON line.

    .venv/bin/python scripts/soak.py --requests 1000000 --seed 0 --policy fair

Exits non-zero (AssertionError) at the first broken invariant: a request that never ends or
ends twice or without a reason, broken KV/slot accounting, anything held after the run.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

from tokenfair.benchmarks.soak import SoakConfig, run_soak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="fair")
    ap.add_argument("--rate", type=float, default=SoakConfig.rate_per_s, help="arrivals per simulated second")
    args = ap.parse_args()
    if args.requests <= 0 or args.rate <= 0:
        ap.error("--requests and --rate must be > 0")
    def progress(arrived, rep):
        print(json.dumps({"arrived": arrived, "ended": sum(rep.by_status.values()), "steps": rep.num_steps,
                          "max_live": rep.max_live, "wall_s": round(rep.wall_s, 1),
                          "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}),
              file=sys.stderr, flush=True)
    report = run_soak(SoakConfig(num_requests=args.requests, seed=args.seed, policy=args.policy, rate_per_s=args.rate),
                      progress)
    print(json.dumps({"policy": args.policy, "seed": args.seed, **report.as_dict()}))


if __name__ == "__main__":
    main()
