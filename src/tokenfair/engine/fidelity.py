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


def _latencies(records: list[dict]) -> dict[str, tuple[float, float]]:
    return {r["request_id"]: (r["first_token_s"] - r["arrival_s"], r["finish_s"] - r["arrival_s"])
            for r in records if r["status"] == "finished"}


def _median_ape(pairs: list[tuple[float, float]]) -> float | None:
    return float(np.median([_ape(a, b) for a, b in pairs])) if pairs else None


def repeat_report(reals: list[RealOutput], sim_records: list[dict]) -> dict:
    """How far the real engine is from *itself*: the same workload replayed ``len(reals)``
    times.  Per-request median |err| of TTFT / e2e for every pair of real runs (the noise
    floor no simulator can beat against a single run), of the simulator against each real run,
    and of the simulator against each request's median over the real runs (requests finished
    in every run)."""
    runs = [_latencies(r.records) for r in reals]
    sim = _latencies(sim_records)
    ids = [i for i in runs[0] if i in sim and all(i in run for run in runs)]

    def errors(a: dict, b: dict) -> dict:
        return {"ttft": _median_ape([(a[i][0], b[i][0]) for i in ids]),
                "e2e": _median_ape([(a[i][1], b[i][1]) for i in ids])}

    median = {i: tuple(float(np.median([run[i][m] for run in runs])) for m in (0, 1)) for i in ids}
    pairs = [(j, k) for j in range(len(runs)) for k in range(j + 1, len(runs))]
    return {"runs": len(runs), "requests": len(ids),
            "real_vs_real": [{"runs": [j + 1, k + 1], **errors(runs[j], runs[k])} for j, k in pairs],
            "sim_vs_real": [errors(run, sim) for run in runs],
            "sim_vs_real_median": errors(median, sim)}


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

    from .real import load_model

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
    reals: list[RealOutput] = [
        run_real(workload, policy, contract, model_spec, profile=profile, num_threads=num_threads,
                 max_requests=max_requests, time_scale=time_scale, num_blocks=num_blocks, seed=seed,
                 dtype=dtype or torch.float32, progress=progress,
                 out_dir=None if out_dir is None else Path(out_dir) / ("real" if i == 0 else f"real{i + 1}"))
        for i in range(repeats)]
    real = reals[0]
    sim = simulate(real.workload, policy, contract, real.profile, isolated=False)
    if out_dir is not None:
        write_run(Path(out_dir) / "sim", sim.records, sim.summary, sim.timeline)
    res = compare(real.records, real.timeline, real.summary, sim.records, sim.timeline, sim.summary)
    if repeats > 1:
        res["repeat"] = repeat_report(reals, sim.records)
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
