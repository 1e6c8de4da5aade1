"""What each policy does with the parts of the contract that in-time goodput does not count,
on a random mix of ``scripts/outside_acceptance.py`` (or a built-in scenario's seed).

For fair, fifo and vtc, one line each: in-time goodput (tokens of the requests whose first
token came within their class's max wait), how many of the light tenants' tokens that is
(of all they asked; a mix's light tenants as ``random_mix`` names them, a scenario's as the
acceptance criteria do), SLO goodput, and each class's P99 TPOT against its TPOT SLO.  Where a
baseline's in-time goodput is above fair's, these say what it spent to get there: the light
tenants' service, or the streams' TPOT.

    python scripts/mix_policies.py --seed 211 [--scenario NAME] [--profile NAME]
"""
import argparse

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import load_profile, profile_arg
from tokenfair.evaluation.acceptance import BASELINES, LIGHT
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.random_mix import random_mix
from tokenfair.workloads.scenarios import SCENARIOS, build_scenario

POLICIES = ("fair", *BASELINES)


def policy_line(policy: str, summary: dict, light: set[str], light_asked: int, contract: Contract) -> str:
    """One policy's figures (module docstring) from its ``summary.json`` as a line;
    ``light_asked``: the light tenants' tokens in the workload."""
    tenants = summary["tenants"]
    light_in_time = sum(tenants[t]["goodput"]["in_time_tokens"] for t in light if t in tenants)
    light_part = ""
    if light:
        light_part = f"light tenants in time {light_in_time / 1e6:.3f} of {light_asked / 1e6:.3f} M; "
    tpots = []
    for name, spec in sorted(contract.classes.items()):
        tpot = summary["classes"].get(name, {}).get("tpot_s")
        if tpot:
            slo = "-" if spec.tpot_slo_s is None else f"{spec.tpot_slo_s:g}"
            tpots.append(f"{name} {tpot['p99']:.3f} s (SLO {slo})")
    g = summary["goodput"]
    return (f"{policy}: in-time goodput {g['in_time_tokens'] / 1e6:.3f} M tokens; {light_part}"
            f"SLO goodput {g['slo_tokens'] / 1e6:.3f} M; "
            f"P99 TPOT {', '.join(tpots) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True, help="the mix's seed (or the scenario's)")
    ap.add_argument("--scenario", default=None, choices=SCENARIOS,
                    help="a built-in scenario's seed instead of a random mix")
    ap.add_argument("--profile", type=profile_arg, default=None)
    a = ap.parse_args()
    if a.seed < 0:
        ap.error(f"argument --seed: a seed is 0 or more, got {a.seed}")
    profile = load_profile(a.profile)
    if a.scenario:
        (wl, contract), light = build_scenario(a.scenario, a.seed), set(LIGHT.get(a.scenario, ()))
    else:
        wl, contract, named = random_mix(a.seed)
        light = set(named)
    print(f"{wl.name}: {len(wl.rows)} requests; light tenants: {', '.join(sorted(light)) or '-'}")
    light_asked = sum(r.prompt_tokens + r.output_tokens for r in wl.rows if r.tenant in light)
    for policy in POLICIES:
        res = simulate(wl, policy, contract, profile, isolated=False)
        print(policy_line(policy, res.summary, light, light_asked, contract), flush=True)


if __name__ == "__main__":
    main()
