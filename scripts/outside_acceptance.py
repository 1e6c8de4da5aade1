"""The acceptance criteria of ``scripts/acceptance.py`` on random tenant mixes with random
contracts (``workloads/random_mix.py``): workloads outside the built-in scenarios.  One line
per mix (fair's and the baselines' in-time goodput, what fair shed and its precision, the
criteria not met), then how many mixes missed each criterion, on how many fair shed and beat
the best baseline's in-time goodput, and each policy's in-time goodput summed over the mixes.

Usage: python scripts/outside_acceptance.py [--seeds 0-59] [--profile NAME] [--jobs N]

``--jobs N`` evaluates the mixes in N worker processes; the output is the same, in seed order.
"""
import argparse
from collections import Counter
from multiprocessing import Pool
from typing import Iterator, NamedTuple

from tokenfair.core.costmodel import Profile, load_profile, profile_arg
from tokenfair.evaluation.acceptance import BASELINES, evaluate_workload
from tokenfair.workloads.random_mix import random_mix, seed_range_arg

POLICIES = ("fair", *BASELINES)


class MixResult(NamedTuple):
    line: str                     # the mix's line
    missed: list[str]             # the criteria it missed, sorted
    good: dict[str, float]        # each policy's in-time goodput, M tokens
    shed: int                     # requests fair shed


def _detail(name: str, failed: list) -> str:
    """``name`` with fair's figure against its limit (the worst tenant's, for a light one)."""
    worst = max((c for c in failed if c.name == name), key=lambda c: (c.value or 0) / (c.limit or 1))
    if name.startswith("in-time goodput"):
        return f"{name}: {worst.value / worst.limit:.3f}x {worst.detail}'s"
    who = f" {worst.detail}" if worst.detail and name.startswith("light") else ""
    return f"{name}:{who} {worst.value:.3g} vs {worst.limit:.3g}"


def evaluate_mix(seed: int, profile: Profile) -> MixResult:
    """Mix ``seed`` under fair, fifo and vtc, judged by the acceptance criteria."""
    wl, contract, light = random_mix(seed)
    r = evaluate_workload(wl.name, wl, contract, profile, light)
    good = {p: r["summaries"][p]["goodput"]["in_time_tokens"] / 1e6 for p in POLICIES}
    shed = r["shedding"]
    failed = [c for c in r["criteria"] if not c.passed]
    names = sorted({c.name for c in failed})
    precision = "-" if shed["precision"] is None else f"{shed['precision']:.0%}"
    line = (f"mix {seed}: {len(wl.rows)} requests, {len(contract.tenants)} tenants ({len(light)} light); "
            f"in-time goodput M tokens fair {good['fair']:.2f} fifo {good['fifo']:.2f} vtc {good['vtc']:.2f}; "
            f"shed {shed['shed']} (precision {precision}); "
            f"not met: {'; '.join(_detail(n, failed) for n in names) or '-'}")
    return MixResult(line, names, good, shed["shed"])


def _evaluate(args: tuple[int, str | None]) -> MixResult:
    seed, profile_name = args
    return evaluate_mix(seed, load_profile(profile_name))


def _results(seeds: list[int], profile_name: str | None, jobs: int) -> Iterator[MixResult]:
    """Each mix's result, in seed order."""
    if jobs == 1:
        profile = load_profile(profile_name)
        yield from (evaluate_mix(s, profile) for s in seeds)
        return
    with Pool(jobs) as pool:
        yield from pool.imap(_evaluate, [(s, profile_name) for s in seeds])


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=seed_range_arg, default="0-59", help="a seed or a range LO-HI")
    ap.add_argument("--profile", type=profile_arg, default=None)
    ap.add_argument("--jobs", type=_positive_int, default=1, help="worker processes (default 1)")
    a = ap.parse_args()
    missed: Counter[str] = Counter()
    totals = dict.fromkeys(POLICIES, 0.0)
    all_met = num_shed = num_above = 0
    for res in _results(a.seeds, a.profile, a.jobs):
        print(res.line, flush=True)
        missed.update(res.missed)
        all_met += not res.missed
        num_shed += res.shed > 0
        num_above += res.good["fair"] > max(res.good["fifo"], res.good["vtc"])
        for p in POLICIES:
            totals[p] += res.good[p]
    n = len(a.seeds)
    print(f"\n{n} mixes, every criterion met on {all_met}; mixes that missed each criterion:")
    for name, k in sorted(missed.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {name}: {k}")
    print(f"fair sheds on {num_shed} of the {n} mixes; its in-time goodput is above the best baseline's on {num_above}")
    print("in-time goodput summed over the mixes, M tokens: "
          + ", ".join(f"{p} {totals[p]:.2f}" for p in POLICIES))


if __name__ == "__main__":
    main()
