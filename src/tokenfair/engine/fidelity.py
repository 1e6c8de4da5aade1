"""Simulator fidelity: the same workload, policy, contract and (calibrated) profile on the
real engine (wall clock) and in the simulator (virtual clock), compared request by request
(the metrics: :mod:`tokenfair.engine.fidelity_metrics`), and :func:`fidelity_table`.
The simulator uses the profile the real run used (same KV geometry).
"""

from __future__ import annotations

from pathlib import Path

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..runtime.output import write_run
from ..sim.simulate import simulate
from .calibrate import COEFFS, write_profile
from .fidelity_metrics import compare, repeat_report, step_model_error
from .replay import RealOutput, run_real


def fidelity(workload, policy: str, contract: Contract, model_spec="default", profile: Profile | None = None, *,
             out_dir: str | Path | None = None, max_requests: int | None = None, time_scale: float = 1.0,
             num_threads: int = 2, num_blocks: int | None = None, seed: int = 0, dtype=None,
             calibrate_first: bool = False, calibrate_kwargs: dict | None = None, progress=None,
             repeats: int = 1) -> dict:
    """Run ``workload`` on the real engine, then simulate the identical (limited, scaled)
    workload with the profile the real run used; return :func:`compare`'s dict (plus the
    real output under ``"_real"``, not JSON).  Writes ``out_dir/{real,sim}/`` and
    ``out_dir/fidelity.json`` when ``out_dir`` is given.

    ``calibrate_first`` fits the profile on this machine immediately before the real run, in
    the same process and threads (``calibrate_kwargs`` go to ``calibrate``), so the real
    run and the profile see the same machine load; it replaces ``profile``.
    ``repeats > 1`` replays the workload that many times on a fresh engine each
    (``out_dir/real2/``, ...) and adds :func:`repeat_report` under ``"repeat"``; the other
    figures compare the simulator with the first real run."""
    import json

    import torch

    from .setup import load_model

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    model_spec = load_model(model_spec)
    calibration = None
    if calibrate_first:
        from .calibrate import calibrate

        cal = calibrate(model_spec, num_threads=num_threads, dtype=dtype or torch.float32, seed=seed,
                        **(calibrate_kwargs or {}))
        profile = cal.profile
        calibration = {**cal.fit, "shapes": len(cal.samples), "seconds": cal.seconds,
                       "coefficients": {k: getattr(profile, k) for k in COEFFS}}
        if out_dir is not None:
            write_profile(cal, Path(out_dir) / "profile.yaml", source=model_spec.source, num_threads=num_threads)
    def replay(name: str) -> RealOutput:
        return run_real(workload, policy, contract, model_spec, profile=profile, num_threads=num_threads,
                        max_requests=max_requests, time_scale=time_scale, num_blocks=num_blocks, seed=seed,
                        dtype=dtype or torch.float32, progress=progress,
                        out_dir=None if out_dir is None else Path(out_dir) / name)

    real = replay("real")
    # only the records of the repeats are kept: each engine holds its own KV pool
    repeated = [replay(f"real{i + 1}").records for i in range(1, repeats)]
    sim = simulate(real.workload, policy, contract, real.profile, isolated=False)
    if out_dir is not None:
        write_run(Path(out_dir) / "sim", sim.records, sim.summary, sim.timeline)
    res = compare(real.records, real.timeline, real.summary, sim.records, sim.timeline, sim.summary)
    if repeats > 1:
        res["repeat"] = repeat_report([real.records, *repeated], sim.records)
    res["step_model"] = step_model_error(real.engine.step_log, real.profile)
    res.update({"policy": policy, "workload": real.workload.name, "profile": real.profile.name,
                "requests_total": len(real.records), "num_threads": num_threads,
                "dtype": real.summary["dtype"], "calibration": calibration})
    if out_dir is not None:
        Path(out_dir, "fidelity.json").write_text(json.dumps(res, indent=2))
    res["_real"] = real
    return res


def fidelity_table(res: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{v:.1%}"

    def num(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"fidelity: policy={res.get('policy')} workload={res.get('workload')} profile={res.get('profile')} "
             f"({res['matched_finished']} requests finished in both; {res['status_mismatches']} status mismatches)"]
    cal = res.get("calibration")
    if cal:
        lines.append(f"  calibrated just before the run: {cal['shapes']} shapes in {cal['seconds']:.0f}s, "
                     f"fit mean |err| {pct(cal['mape'])}, R^2 {cal['r2']:.3f}")
    lines += [f"  TTFT  |err|: median {pct(res['ttft_ape']['median'])}  p90 {pct(res['ttft_ape']['p90'])}",
              f"  e2e   |err|: median {pct(res['e2e_ape']['median'])}  p90 {pct(res['e2e_ape']['p90'])}"]
    sm = res.get("step_model")
    if sm and sm["steps"]:
        lines.append(f"  step-time model over {sm['steps']} real steps: median |err| {pct(sm['median_ape'])}, "
                     f"p90 {pct(sm['p90_ape'])}, measured/predicted {num(sm['bias'])}")
    rep = res.get("repeat")
    if rep:
        def both(errs):
            return (" / ".join(pct(e["ttft"]) for e in errs), " / ".join(pct(e["e2e"]) for e in errs))
        lines += [f"  the real run repeated {rep['runs']} times ({rep['requests']} requests finished in all):",
                  "    real vs real (every pair)  TTFT |err| median {}  e2e {}".format(*both(rep["real_vs_real"])),
                  "    sim vs each real run       TTFT |err| median {}  e2e {}".format(*both(rep["sim_vs_real"])),
                  "    sim vs per-request median  TTFT |err| median {}  e2e {}".format(
                      *both([rep["sim_vs_real_median"]]))]
    lines += _percentile_lines(res.get("percentiles"), pct)
    lines.append(f"  share of the first 25/50/75/100% of service (real | sim), max |err| "
                 f"{pct(res['max_share_error'])}:")
    for t, v in res["tenant_share"].items():
        name = t if len(t) <= 22 else "..." + t[-19:]
        real = " ".join(f"{x:5.1%}" for x in v["real"].values())
        sim = " ".join(f"{x:5.1%}" for x in v["sim"].values())
        lines.append(f"  {name:<22} {real} | {sim}  max|err| {v['max_abs_error']:.1%}")
    lines.append(f"  {'':<22}{'real':>11}{'sim':>11}")
    for k, v in res["run"].items():
        if k == "status":
            continue
        lines.append(f"  {k:<22}{num(v['real']):>11}{num(v['sim']):>11}")
    lines.append(f"  status real={res['run']['status']['real']} sim={res['run']['status']['sim']}")
    return "\n".join(lines)


def _percentile_lines(perc: dict | None, pct) -> list[str]:
    if not perc or perc["all"] is None:
        return []

    def row(label: str, g: dict) -> str:
        cells = []
        for metric in ("ttft", "e2e"):
            q = g[metric]
            real = " / ".join(f"{v['real']:.2f}" for v in q.values())
            sim = " / ".join(f"{v['sim']:.2f}" for v in q.values())
            err = " / ".join(pct(v["ape"]) for v in q.values())
            cells.append(f"{metric.upper() if metric == 'ttft' else metric} {real} | {sim} s ({err})")
        return f"    {label[-22:]:<22} n={g['requests']:<4} " + "   ".join(cells)

    points = "/".join(perc["all"]["ttft"])
    lines = [f"  {points} latency, real | sim (|err|), over requests finished in both:", row("all", perc["all"])]
    lines += [row(f"class {name}", g) for name, g in perc["class"].items()]
    tenants = perc["tenant"]
    if tenants:
        worst = max(tenants, key=lambda t: max(v["ape"] for v in tenants[t]["ttft"].values()))
        lines.append(row(f"{worst}", tenants[worst]) + "   <- tenant with the worst TTFT percentile")
    return lines
