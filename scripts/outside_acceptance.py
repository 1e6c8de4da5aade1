"""The acceptance criteria of ``scripts/acceptance.py`` on random tenant mixes with random
contracts (``workloads/random_mix.py``): workloads outside the built-in scenarios.  One line
per mix (fair's and the baselines' in-time goodput, what fair shed and its precision, the
criteria not met), then how many mixes missed each criterion.

Usage: python scripts/outside_acceptance.py [--seeds 0-59] [--profile NAME]
"""
import argparse
from collections import Counter

from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.acceptance import evaluate_workload
from tokenfair.workloads.random_mix import random_mix, seed_range_arg


def _detail(name: str, failed: list) -> str:
    """``name`` with fair's figure against its limit (the worst tenant's, for a light one)."""
    worst = max((c for c in failed if c.name == name), key=lambda c: (c.value or 0) / (c.limit or 1))
    if name.startswith("in-time goodput"):
        return f"{name}: {worst.value / worst.limit:.3f}x {worst.detail}'s"
    who = f" {worst.detail}" if worst.detail and name.startswith("light") else ""
    return f"{name}:{who} {worst.value:.3g} vs {worst.limit:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=seed_range_arg, default="0-59", help="a seed or a range LO-HI")
    ap.add_argument("--profile", default=None)
    a = ap.parse_args()
    prof = load_profile(a.profile)
    missed: Counter[str] = Counter()
    seeds = a.seeds
    all_met = 0
    for seed in seeds:
        wl, contract, light = random_mix(seed)
        r = evaluate_workload(wl.name, wl, contract, prof, light)
        good = {p: s["goodput"]["in_time_tokens"] / 1e6 for p, s in r["summaries"].items()}
        shed = r["shedding"]
        failed = [c for c in r["criteria"] if not c.passed]
        names = sorted({c.name for c in failed})
        missed.update(names)
        all_met += not failed
        precision = "-" if shed["precision"] is None else f"{shed['precision']:.0%}"
        print(f"mix {seed}: {len(wl.rows)} requests, {len(contract.tenants)} tenants ({len(light)} light); "
              f"in-time goodput M tokens fair {good['fair']:.2f} fifo {good['fifo']:.2f} vtc {good['vtc']:.2f}; "
              f"shed {shed['shed']} (precision {precision}); not met: {'; '.join(_detail(n, failed) for n in names) or '-'}",
              flush=True)
    print(f"\n{len(seeds)} mixes, every criterion met on {all_met}; mixes that missed each criterion:")
    for name, n in sorted(missed.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {name}: {n}")


if __name__ == "__main__":
    main()
