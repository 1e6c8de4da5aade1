"""Print the fair policy's acceptance figures against fifo and vtc on the six built-in
scenarios, as a markdown table (the README's table and docs/BENCHMARKS.md come from it).

Usage: python scripts/acceptance.py [--seed N] [--profile NAME] [--scenarios hol,whale] [--rate-scale X]
"""
import argparse

from tokenfair.evaluation.acceptance import evaluate_scenario
from tokenfair.core.costmodel import load_profile, profile_arg
from tokenfair.workloads.scenarios import SCENARIOS


def _f(v, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v)


def _row(r: dict) -> str:
    s = r["summaries"]
    fair, fifo, vtc = s["fair"], s["fifo"], s["vtc"]
    good = {p: s[p]["goodput"]["in_time_tokens"] / 1e6 for p in s}
    shed = r["shedding"]
    rejected = sum(n for codes in fair["outcomes"].values() for n in codes.values())
    failed: dict[str, int] = {}
    for c in r["criteria"]:
        if not c.passed:
            failed[c.name] = failed.get(c.name, 0) + 1
    missed = ", ".join(f"{n} ({k} tenants)" if k > 1 else n for n, k in failed.items())
    return (f"| {r['scenario']} | {good['fair']:.2f} ({good['fifo']:.2f}, {good['vtc']:.2f}) "
            f"| {fair['finished_tokens'] / 1e6:.2f} ({fifo['finished_tokens'] / 1e6:.2f}) "
            f"| {fair['starvation_events']} ({fifo['starvation_events']}, {vtc['starvation_events']}) "
            f"| {fair['longest_service_gap_s']:.1f} ({vtc['longest_service_gap_s']:.1f}) "
            f"| {_f(fair['fairness']['jain_min'])} ({_f(vtc['fairness']['jain_min'])}) "
            f"| {rejected} of {r['requests']} ({_f(shed['precision'], '{:.0%}')}) "
            f"| {fair['recovery_cost_fraction']:.2%} | {r['light_text'] or '-'} "
            f"| {missed or 'all met'} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", type=profile_arg, default=None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--rate-scale", type=float, default=1.0,
                    help="compress each scenario's arrivals in time by this factor (the same requests)")
    a = ap.parse_args()
    prof = load_profile(a.profile)
    print("| scenario | in-time goodput, M tokens: fair (fifo, vtc) | finished, M tokens: fair (fifo) "
          "| starvation events: fair (fifo, vtc) | longest service gap s: fair (vtc) "
          "| Jain among backlogged: fair (vtc) | not finished (shedding precision) | recovery cost "
          "| light tenants' P99 TTFT | criteria not met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.scenarios.split(","):
        print(_row(evaluate_scenario(name, prof, a.seed, a.rate_scale)), flush=True)


if __name__ == "__main__":
    main()
