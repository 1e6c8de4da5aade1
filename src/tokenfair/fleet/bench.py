"""``tokenfair bench fleet``: fleet fairness error against the number of gateways and the
injected Redis latency, and the latency a Redis round trip adds to a gateway.

Fairness.  Per number of gateways N and injected latency (a sleep before every Redis call,
on top of loopback's round trip), a fleet of N gateways in front of two fake FIFO backends
(``rehearsal.py``) serves three backlogged tenants of weights 1, 2, 3 with a *skewed*
spread: tenant ``a`` reaches only the first gateway, ``b`` and ``c`` every gateway
round-robin (closed loop, 8 clients each, for ``duration`` s and at least 150 finished
requests).  The error is the largest gap, over tenants, between its share of the cost
served while all are backlogged and its entitled share
w_i / sum w; the same load through N independent gateways (no shared state) is the
baseline.  Requests refused (non-200) are counted next to each figure.

Latency: ``bench_latency.py`` (a plain and a ``--redis`` gateway side by side, Redis over
loopback TCP and a unix socket).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from ..contracts.contract import Contract, parse_contract
from ..serve.auth import KeyRing, hash_key
from .bench_latency import format_latency, latency_bench, round_trip_floor
from .redis_server import RedisServer
from .rehearsal import FleetSpec, StopRule, closed_loop, shares, start_fleet

WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0}
KEYS = {t: f"bench-key-{t}" for t in WEIGHTS}
CLIENTS_PER_TENANT = 8
MIN_FINISHED = 150        # a run measures shares on at least this many requests


def bench_contract() -> Contract:
    tenants = {t: {"weight": w, "api_key_sha256": [hash_key(KEYS[t])]} for t, w in WEIGHTS.items()}
    return parse_contract({"version": "bench-fleet", "tenants": tenants, "admission": {"shed_over_max_wait": False}})


def fairness_run(num_gateways: int, redis_url: str | None, latency_s: float, duration_s: float, fleet: str) -> dict:
    c = bench_contract()
    spec = FleetSpec(num_gateways=num_gateways, redis_url=redis_url, fleet=fleet, inject_latency_s=latency_s,
                     timeout_s=max(1.0, 20 * latency_s))
    wp, wd = c.costs.prefill_token, c.costs.decode_token

    rule = StopRule(duration_s, MIN_FINISHED)

    async def load(urls: list[str]):
        rule.t0 = time.perf_counter()
        return await asyncio.gather(
            closed_loop(urls[:1], KEYS, {"a": CLIENTS_PER_TENANT}, rule, wp=wp, wd=wd),
            closed_loop(urls, KEYS, {"b": CLIENTS_PER_TENANT, "c": CLIENTS_PER_TENANT}, rule, wp=wp, wd=wd))

    with ExitStack() as stack:
        fl = start_fleet(spec, c, KeyRing(c), stack)
        first, rest = asyncio.run(load(fl.urls))
        outages = sum(getattr(gw, "fleet").num_degraded for gw in fl.gateways) if redis_url else 0
    served = {**first.served, **rest.served}
    counts = {**first.counts, **rest.counts}
    got = shares(served)
    total_w = sum(WEIGHTS.values())
    error = max(abs(got[t] - WEIGHTS[t] / total_w) for t in WEIGHTS)
    num_ok = sum(n for v in counts.values() for k, n in v.items() if k == "200")
    refused = sum(n for v in counts.values() for k, n in v.items() if k != "200")
    return {"gateways": num_gateways, "shared": redis_url is not None, "latency_ms": latency_s * 1000,
            "error": error, "shares": got, "requests_per_s": num_ok / max(first.wall_s, rest.wall_s),
            "measured_requests": rule.finished,
            "refused": refused, "degraded": outages}


def median_run(repeats: int, *args) -> dict:
    """The run with the median error of ``repeats`` runs, with every run's error and rate."""
    runs = sorted((fairness_run(*args[:-1], f"{args[-1]}-{i}") for i in range(repeats)), key=lambda r: r["error"])
    mid = dict(runs[len(runs) // 2])
    mid["errors"] = [r["error"] for r in runs]
    mid["rates"] = sorted(r["requests_per_s"] for r in runs)
    mid["requests_per_s"] = mid["rates"][len(runs) // 2]
    mid["refused"] = sum(r["refused"] for r in runs)
    mid["degraded"] = sum(r["degraded"] for r in runs)
    return mid


def fairness_table(gateways: list[int], latencies_ms: list[float], duration_s: float, workdir: Path,
                   repeats: int = 1) -> list[dict]:
    rows = []
    srv = RedisServer(workdir / "redis", persist=False).start()
    try:
        for n in gateways:
            rows.append(median_run(repeats, n, None, 0.0, duration_s, "none"))
            for ms in latencies_ms:
                rows.append(median_run(repeats, n, srv.url, ms / 1000.0, duration_s, f"bench-{n}-{ms:g}"))
    finally:
        srv.stop()
    return rows


def plot_fairness(rows: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = f"fleet, Redis +{r['latency_ms']:g} ms" if r["shared"] else "independent gateways"
        series.setdefault(label, []).append((r["gateways"], 100 * r["error"]))
    for label, pts in series.items():
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, marker="o", linestyle="--" if label.startswith("indep") else "-", label=label)
    ax.set_xlabel("gateways")
    ax.set_ylabel("fairness error (max |share - entitled|, %)")
    ax.set_xticks(sorted({r["gateways"] for r in rows}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_bench(out: Path, gateways: list[int], latencies_ms: list[float], duration_s: float, rate: float,
              latency_duration_s: float, repeats: int = 1) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]      # the fairness runs below load the host themselves
    with tempfile.TemporaryDirectory(prefix="tf-bench-fleet-") as tmp:
        work = Path(tmp)
        rows = fairness_table(gateways, latencies_ms, duration_s, work, repeats)
        if latency_duration_s > 0:        # it times the bare round trip over each transport first
            latency = latency_bench(rate, latency_duration_s, work / "latency", runs=repeats,
                                    load_before=load_before)
            script = latency["tcp"]["round_trip"]["back_to_back"]
        else:
            latency = None
            script = round_trip_floor(work, "tcp", num_idle_calls=0)["back_to_back"]
    plot_fairness(rows, out / "fleet_fairness.png")
    result = {"fairness": rows, "latency": latency, "dispatch_script": script, "cpus": os.cpu_count(),
              "config": {"duration_s": duration_s, "clients_per_tenant": CLIENTS_PER_TENANT, "weights": WEIGHTS,
                         "repeats": repeats}}
    (out / "fleet_bench.json").write_text(json.dumps(result, indent=2))
    return result


def format_bench(result: dict) -> str:
    lines = ["| gateways | state | Redis latency | fairness error (median; all runs) | shares a / b / c | "
             "requests/s | refused | fell back to local |", "|---|---|---|---|---|---|---|---|"]
    for r in result["fairness"]:
        s = r["shares"]
        every = ", ".join(f"{100 * e:.1f}" for e in r.get("errors", [r["error"]]))
        lines.append(f"| {r['gateways']} | {'fleet (Redis)' if r['shared'] else 'independent'} | "
                     f"{'+' + format(r['latency_ms'], 'g') + ' ms' if r['shared'] else '-'} | "
                     f"**{100 * r['error']:.1f}%** ({every}) | "
                     f"{s['a']:.3f} / {s['b']:.3f} / {s['c']:.3f} | {r['requests_per_s']:.0f} | {r['refused']} | "
                     f"{r.get('degraded', 0) if r['shared'] else '-'} |")
    sc = result.get("dispatch_script")
    if sc:
        lines += ["", f"dispatch script round trip (loopback, 8 tenants backlogged, {sc['n']} calls): "
                      f"p50 {sc['p50_ms']} ms, p99 {sc['p99_ms']} ms"]
    lat = result.get("latency")
    if lat:
        lines += ["", format_latency(lat)]
    return "\n".join(lines)
