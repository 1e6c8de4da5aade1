"""Print the fair policy's acceptance figures against FIFO on the four built-in scenarios,
as a markdown table (the README's table comes from this script).

Usage: python scripts/acceptance.py [--seed N] [--profile NAME] [--scenarios hol,whale]
"""
import argparse

from tokenfair.costmodel import load_profile
from tokenfair.scenarios import SCENARIOS, build_scenario
from tokenfair.sim.simulate import simulate

LIGHT = {"whale": ["small-0", "small-1", "small-2", "small-3"], "hol": ["chat"]}


def _f(v, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    prof = load_profile(a.profile)
    print("| scenario | throughput fair/FIFO | Jain min fair (FIFO) | starvation fair (FIFO) | rejected (shed) "
          "| recovery cost | light tenants' P99 TTFT / isolated | other |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.scenarios.split(","):
        wl, c = build_scenario(name, a.seed)
        fifo = simulate(wl, "fifo", c, prof, isolated=False).summary
        fair = simulate(wl, "fair", c, prof, isolated=name in LIGHT).summary
        ratio = fair["throughput_tokens_per_s"] / fifo["throughput_tokens_per_s"]
        light = ", ".join(f"{t} {fair['tenants'][t]['ttft_p99_vs_isolated']:.2f}" for t in LIGHT.get(name, []))
        other = []
        for k, v in fair["fairness"]["class_min_share"].items():
            other.append(f"class {k} got {v['ratio_to_min_share']:.2f}x its min share")
        if "stream" in fair["tenants"]:
            other.append(f"stream P99 TPOT {fair['tenants']['stream']['tpot_s']['p99'] * 1e3:.0f} ms "
                         f"(FIFO {fifo['tenants']['stream']['tpot_s']['p99'] * 1e3:.0f} ms, SLO "
                         f"{c.classes['interactive'].tpot_slo_s * 1e3:.0f} ms)")
        print(f"| {name} | {ratio:.3f} | {_f(fair['fairness']['jain_min'])} ({_f(fifo['fairness']['jain_min'])}) "
              f"| {fair['starvation_events']} ({fifo['starvation_events']}) "
              f"| {fair['status'].get('rejected', 0)} of {fair['requests']} "
              f"| {fair['recovery_cost_fraction']:.2%} | {light or '-'} | {'; '.join(other) or '-'} |")


if __name__ == "__main__":
    main()
