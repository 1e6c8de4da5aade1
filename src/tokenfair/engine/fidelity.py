"""Simulator fidelity: the same workload, policy, contract and (calibrated) profile on the
real engine (wall clock) and in the simulator (virtual clock), compared request by request.

Reported:
  * per-request absolute percentage error of TTFT and of end-to-end latency (median, p90;
    requests finished in both runs, matched by id);
  * per-tenant share of cost-weighted service, progress-aligned: each tenant's share of the
    first 25 / 50 / 75 / 100 % of all service delivered in each run (wall and virtual time
    differ, progress does not), and the largest absolute difference;
  * step-time model error: the profile's prediction for every real step's exact shape vs its
    measured time (median |err|, and bias = total measured / total predicted), which
    separates cost-model error from scheduling divergence;
  * run-level numbers side by side (makespan, throughput, preemptions, status counts).
The simulator uses the profile the real run used (same KV geometry).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..contract import Contract
from ..costmodel import Profile
from ..output import write_run
from ..sim.simulate import simulate
from .calibrate import COEFFS, write_profile
from .real import RealOutput, run_real


def _ape(real: float, sim: float) -> float:
    return abs(sim - real) / max(abs(real), 1e-9)


PROGRESS = (0.25, 0.5, 0.75, 1.0)


def progress_shares(timeline: dict, points=PROGRESS) -> dict[float, dict[str, float]]:
    """Each tenant's share of the first ``p`` of all service, for each ``p`` in ``points``
    (1 s buckets; the bucket that crosses ``p`` counts pro rata)."""
    series = {t: {int(b): float(x) for b, x in v.items()} for t, v in timeline["tenant_service"].items()}
    buckets = sorted({b for v in series.values() for b in v})
    total = sum(sum(v.values()) for v in series.values())
    out: dict[float, dict[str, float]] = {}
    for p in points:
        target, acc = p * total, 0.0
        got = {t: 0.0 for t in series}
        for b in buckets:
            step = {t: v.get(b, 0.0) for t, v in series.items()}
            n = sum(step.values())
            if n <= 0:
                continue
            frac = min(1.0, (target - acc) / n)
            for t, x in step.items():
                got[t] += frac * x
            acc += frac * n
            if acc >= target - 1e-12:
                break
        s = sum(got.values())
        out[p] = {t: (x / s if s else 0.0) for t, x in got.items()}
    return out


def step_model_error(step_log, profile: Profile) -> dict:
    """The profile's step time for each real step's shape vs the measured time (swaps excluded)."""
    ape, meas, pred = [], 0.0, 0.0
    for prefill, ctx, n_dec, seconds, swap_s in step_log:
        p = profile.step_s(prefill, ctx, n_dec)
        m = max(1e-9, seconds - swap_s)
        ape.append(abs(p - m) / m)
        meas += m
        pred += p
    if not ape:
        return {"steps": 0, "median_ape": None, "p90_ape": None, "bias": None}
    return {"steps": len(ape), "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90)),
            "bias": meas / pred if pred else None}


def compare(real_records: list[dict], real_timeline: dict, real_summary: dict,
            sim_records: list[dict], sim_timeline: dict, sim_summary: dict) -> dict:
    sim_by_id = {r["request_id"]: r for r in sim_records}
    ttft, e2e, rows = [], [], []
    both = 0
    status_mismatch = 0
    for r in real_records:
        s = sim_by_id.get(r["request_id"])
        if s is None:
            continue
        if r["status"] != s["status"]:
            status_mismatch += 1
        if r["status"] != "finished" or s["status"] != "finished":
            continue
        both += 1
        rt, st = r["first_token_s"] - r["arrival_s"], s["first_token_s"] - s["arrival_s"]
        re, se = r["finish_s"] - r["arrival_s"], s["finish_s"] - s["arrival_s"]
        ttft.append(_ape(rt, st))
        e2e.append(_ape(re, se))
        rows.append({"request_id": r["request_id"], "tenant": r["tenant"], "ttft_real": rt, "ttft_sim": st,
                     "e2e_real": re, "e2e_sim": se})
    real_ps, sim_ps = progress_shares(real_timeline), progress_shares(sim_timeline)
    tenants = sorted(set(real_timeline["tenant_service"]) | set(sim_timeline["tenant_service"]))
    tenant_share = {}
    for t in tenants:
        row = {"real": {}, "sim": {}, "abs_error": {}}
        for p in PROGRESS:
            r, s_ = real_ps[p].get(t, 0.0), sim_ps[p].get(t, 0.0)
            row["real"][f"{p:.0%}"], row["sim"][f"{p:.0%}"] = r, s_
            row["abs_error"][f"{p:.0%}"] = abs(r - s_)
        row["max_abs_error"] = max(row["abs_error"].values())
        tenant_share[t] = row

    def q(a, p):
        return float(np.percentile(a, p)) if a else None

    side = {}
    for key in ("makespan_s", "throughput_tokens_per_s", "preemptions", "engine_steps", "engine_busy_s"):
        side[key] = {"real": real_summary.get(key), "sim": sim_summary.get(key)}
    side["status"] = {"real": real_summary.get("status"), "sim": sim_summary.get("status")}
    return {
        "matched_finished": both, "status_mismatches": status_mismatch,
        "ttft_ape": {"median": q(ttft, 50), "p90": q(ttft, 90), "mean": float(np.mean(ttft)) if ttft else None},
        "e2e_ape": {"median": q(e2e, 50), "p90": q(e2e, 90), "mean": float(np.mean(e2e)) if e2e else None},
        "tenant_share": tenant_share,
        "max_share_error": max((v["max_abs_error"] for v in tenant_share.values()), default=None),
        "run": side,
        "requests": rows,
    }


def fidelity(workload, policy: str, contract: Contract, model_spec="default", profile: Profile | None = None, *,
             out_dir: str | Path | None = None, max_requests: int | None = None, time_scale: float = 1.0,
             num_threads: int = 2, num_blocks: int | None = None, seed: int = 0, dtype=None,
             calibrate_first: bool = False, calibrate_kwargs: dict | None = None, progress=None) -> dict:
    """Run ``workload`` on the real engine, then simulate the identical (limited, scaled)
    workload with the profile the real run used; return :func:`compare`'s dict (plus the
    real output under ``"_real"``, not JSON).  Writes ``out_dir/{real,sim}/`` and
    ``out_dir/fidelity.json`` when ``out_dir`` is given.

    ``calibrate_first`` fits the profile on this machine immediately before the real run, in
    the same process and threads (``calibrate_kwargs`` go to ``calibrate``), so the real
    run and the profile see the same machine load; it replaces ``profile``."""
    import json

    import torch

    calibration = None
    if calibrate_first:
        from .calibrate import calibrate
        from .real import load_model

        model_spec = load_model(model_spec)
        cal = calibrate(model_spec, num_threads=num_threads, dtype=dtype or torch.float32, seed=seed,
                        **(calibrate_kwargs or {}))
        profile = cal.profile
        calibration = {**cal.fit, "shapes": len(cal.samples), "seconds": cal.seconds,
                       "coefficients": {k: getattr(profile, k) for k in COEFFS}}
        if out_dir is not None:
            write_profile(cal, Path(out_dir) / "profile.yaml", source=model_spec.source, num_threads=num_threads)
    real: RealOutput = run_real(workload, policy, contract, model_spec, profile=profile, num_threads=num_threads,
                                max_requests=max_requests, time_scale=time_scale, num_blocks=num_blocks,
                                seed=seed, dtype=dtype or torch.float32, progress=progress,
                                out_dir=None if out_dir is None else Path(out_dir) / "real")
    sim = simulate(real.workload, policy, contract, real.profile, isolated=False)
    if out_dir is not None:
        write_run(Path(out_dir) / "sim", sim.records, sim.summary, sim.timeline)
    res = compare(real.records, real.timeline, real.summary, sim.records, sim.timeline, sim.summary)
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
