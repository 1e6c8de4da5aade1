"""Print the fair policy's acceptance figures against FIFO on the four built-in scenarios.

Usage: python scripts/acceptance.py [--seed N] [--profile NAME]
"""
import argparse

from tokenfair.costmodel import load_profile
from tokenfair.scenarios import SCENARIOS, build_scenario
from tokenfair.sim.simulate import simulate

LIGHT = {"whale": ["mid", "small-0", "small-1", "small-2", "small-3"], "hol": ["chat"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    prof = load_profile(a.profile)
    for name in a.scenarios.split(","):
        wl, c = build_scenario(name, a.seed)
        fifo = simulate(wl, "fifo", c, prof, isolated=False).summary
        fair = simulate(wl, "fair", c, prof).summary
        ratio = fair["throughput_tokens_per_s"] / fifo["throughput_tokens_per_s"]
        light = {t: fair["tenants"][t].get("ttft_p99_vs_isolated") for t in LIGHT.get(name, [])}
        cls = {k: v["ratio_to_min_share"] for k, v in fair["fairness"]["class_min_share"].items()}
        stream_tpot = fair["tenants"].get("stream", {}).get("tpot_s", {}).get("p99")
        print(f"{name:6} thr_ratio={ratio:.3f} jain_min={fair['fairness']['jain_min']} "
              f"(fifo {fifo['fairness']['jain_min']}) starv={fair['starvation_events']} "
              f"status={fair['status']} recovery={fair['recovery_cost_fraction']:.4f} "
              f"light_ttft_p99_vs_iso={ {k: round(v, 2) if v else v for k, v in light.items()} } "
              f"class_min_share_ratio={cls} stream_tpot_p99={stream_tpot}")


if __name__ == "__main__":
    main()
