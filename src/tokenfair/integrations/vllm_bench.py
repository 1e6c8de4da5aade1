"""``tokenfair bench vllm``: real vLLM with and behind tokenfair, compared in one run.

1. *gateway vs direct*: ``streams`` closed-loop streams (each sends its next request when
   the previous one ends) to stock vLLM (128 slots, its engine on one CPU as in part 2)
   directly and through the gateway (saturation window; ``gateway_args``: more
   ``tokenfair gateway`` options; ``compare_backlogs``: more gateways side by side, one per
   ``--max-prefill-backlog`` value), alternated ``repeats`` times; then the heavy-burst + light-tenant workload
   directly and through the gateway: per tenant TTFT.
2. *plugin vs stock*: the heavy-burst + light-tenant workload (two heavy tenants weighted
   2:1, tests/vllm/contract.yaml) on vLLM with the tokenfair scheduler and on stock vLLM
   (both ``--max-num-seqs 6``, both engines on the same CPU), each alone in turn (A B, B A,
   ...), ``repeats`` times: throughput, per-tenant
   TTFT, the heavy tenants' shares while both were backlogged.

Medians over the repeats; every failure is counted next to the throughput.  Servers listen
on 127.0.0.1 only; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from .burst import Result, TenantLoad, percentile, run_burst, run_in_turn, summarize

HEAVY = ("heavy_a", "heavy_b")
PLUGIN_SLOTS = 6            # --max-num-seqs of the plugin-vs-stock pair: bursts queue in vLLM


def burst_workload(scale: int = 1) -> list[TenantLoad]:
    return [TenantLoad("heavy_a", 12 * scale, 5, 32), TenantLoad("heavy_b", 12 * scale, 5, 32),
            TenantLoad("light", 3 * scale, 1, 8, start_s=4.0, spacing_s=1.0, klass="interactive")]


async def _stream_loop(url: str, stream: int, per_stream: int, keys: dict[str, str] | None) -> list[Result]:
    from .burst import run_burst_async
    out: list[Result] = []
    for i in range(per_stream):
        load = TenantLoad("heavy_a", 1, 5, 64, klass=None)
        res = await run_burst_async(url, [load], keys=keys)
        for r in res:
            r.index = stream * per_stream + i
        out.extend(res)
    return out


def closed_loop(url: str, streams: int, per_stream: int, keys: dict[str, str] | None = None) -> dict:
    """Throughput of ``streams`` concurrent closed-loop streams (``per_stream`` requests each)."""
    async def run() -> tuple[list[Result], float]:
        t0 = time.monotonic()
        parts = await asyncio.gather(*(_stream_loop(url, s, per_stream, keys) for s in range(streams)))
        return [r for p in parts for r in p], time.monotonic() - t0
    results, wall = asyncio.run(run())
    ok = [r for r in results if r.status == "finished"]
    tokens = sum(r.output_tokens for r in ok)
    ttft = [r.first_token_s - r.sent_s for r in ok if r.first_token_s is not None]
    return {"requests": len(results), "failed": len(results) - len(ok), "output_tokens": tokens,
            "wall_s": wall, "throughput_tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99)}


def _median_of(rows: list[dict], path: tuple[str, ...]) -> float:
    vals = []
    for r in rows:
        v = r
        for k in path:
            v = v[k]
        vals.append(float(v))
    return statistics.median(vals)


PARTS = ("gateway", "plugin")


def bench_vllm(model_dir: str, logs: Path, repeats: int = 3, streams: int = 16, per_stream: int = 3,
               parts: tuple[str, ...] = PARTS, gateway_args: tuple[str, ...] = (),
               compare_backlogs: tuple[int, ...] = ()) -> dict:
    from ..serve.shutdown import free_port
    from .vllm_process import VllmServer, compared_engine_cpu

    contract = str(Path(__file__).resolve().parents[3] / "tests" / "vllm" / "contract.yaml")
    logs.mkdir(parents=True, exist_ok=True)
    cpu = compared_engine_cpu()
    stock = VllmServer(model_dir, free_port(), logs / "stock.log", cpu_bind=cpu)
    stock6 = VllmServer(model_dir, free_port(), logs / "stock6.log", max_num_seqs=PLUGIN_SLOTS, cpu_bind=cpu)
    plugin6 = VllmServer(model_dir, free_port(), logs / "plugin6.log", contract=contract,
                         records=str(logs / "plugin-records.jsonl"), max_num_seqs=PLUGIN_SLOTS, cpu_bind=cpu)
    servers = ([stock] if "gateway" in parts else []) + ([stock6, plugin6] if "plugin" in parts else [])
    for s in servers:
        s.start()
    out: dict = {"repeats": repeats, "streams": streams, "per_stream": per_stream}
    try:
        for s in servers:
            s.wait_ready()
        if "gateway" in parts:
            out["gateway_vs_direct"] = _gateway_vs_direct(stock, contract, repeats, streams, per_stream, logs,
                                                          gateway_args, compare_backlogs)
        if "plugin" in parts:
            out["plugin_vs_stock"] = _plugin_vs_stock(plugin6, stock6, repeats)
    finally:
        for s in servers:
            s.stop()
    return out


def _gateway_vs_direct(stock, contract: str, repeats: int, streams: int, per_stream: int, logs: Path,
                       gateway_args: tuple[str, ...] = (), compare_backlogs: tuple[int, ...] = ()) -> dict:
    """Direct and through the gateway (``gateway_args``), and through one more gateway per
    ``compare_backlogs`` value (``--max-prefill-backlog N``, side ``gateway_backlog_N``), the
    sides alternated (reversed every other round)."""
    from contextlib import ExitStack

    from .gateway_harness import GatewayProcess
    keys = {"heavy_a": "key-heavy-a", "heavy_b": "key-heavy-b", "light": "key-light"}
    arms = {"gateway": tuple(gateway_args)}
    arms.update({f"gateway_backlog_{n}": ("--max-prefill-backlog", str(n)) for n in compare_backlogs})
    sides: dict[str, tuple[str, dict[str, str] | None]] = {"direct": (stock.url, None)}
    with ExitStack() as stack:
        for name, args in arms.items():
            sides[name] = (stack.enter_context(GatewayProcess(stock.url, contract, keys, logs, args)).url, keys)
        rows: dict[str, list[dict]] = {name: [] for name in sides}
        bursts: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for i in range(repeats):
            for name in (names if i % 2 == 0 else names[::-1]):
                rows[name].append(closed_loop(sides[name][0], streams, per_stream, sides[name][1]))
        for i in range(repeats):
            for name in (names if i % 2 == 0 else names[::-1]):
                url, k = sides[name]
                bursts[name].append(summarize(run_burst(url, burst_workload(2), keys=k), HEAVY))
    res: dict = {name: _gateway_side(rows[name], bursts[name]) for name in sides}
    res["raw"] = {"closed_loop": rows, "burst": bursts}
    return res


def _gateway_side(rows: list[dict], bursts: list[dict]) -> dict:
    return {"throughput_tok_s": _median_of(rows, ("throughput_tok_s",)),
            "failed": sum(r["failed"] for r in rows),
            "burst_light_ttft_p99_s": _median_of(bursts, ("tenants", "light", "ttft_p99_s")),
            "burst_heavy_a_ttft_p99_s": _median_of(bursts, ("tenants", "heavy_a", "ttft_p99_s")),
            "burst_throughput_tok_s": _median_of(bursts, ("throughput_tok_s",)),
            "burst_failed": sum(r["failed"] for r in bursts),
            "runs_tok_s": [round(r["throughput_tok_s"], 1) for r in rows],
            "burst_runs_light_ttft_p99_s": [round(r["tenants"]["light"]["ttft_p99_s"], 2) for r in bursts],
            "burst_runs_tok_s": [round(r["throughput_tok_s"], 1) for r in bursts]}


def _plugin_vs_stock(plugin, stock, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {"stock": [], "plugin": []}
    for name, bursts in run_in_turn({"stock": stock.url, "plugin": plugin.url}, burst_workload(2), repeats).items():
        runs[name] = [summarize(results, HEAVY, slots=PLUGIN_SLOTS) for results in bursts]
    res: dict = {}
    for name, rows in runs.items():
        per = {t: {"ttft_p50_s": _median_of(rows, ("tenants", t, "ttft_p50_s")),
                   "ttft_p99_s": _median_of(rows, ("tenants", t, "ttft_p99_s"))} for t in ("heavy_a", "heavy_b", "light")}
        res[name] = {"throughput_tok_s": _median_of(rows, ("throughput_tok_s",)),
                     "failed": sum(r["failed"] for r in rows),
                     "saturated_tok_s": _median_of(rows, ("saturated_tok_s",)),
                     "share_heavy_a": _median_of(rows, ("shares", "heavy_a")), "tenants": per,
                     "shares_heavy_a": [round(r["shares"]["heavy_a"], 3) for r in rows],
                     "runs_tok_s": [round(r["throughput_tok_s"], 1) for r in rows]}
    return res
