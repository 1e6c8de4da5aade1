"""Gateway overhead benchmark: per-request latency through the gateway vs. the backend directly.

    python -m tokenfair.serve.overhead --rate 50 --duration 20 [--tokens 16] [--token-delay 0.01]

Starts, as separate processes on 127.0.0.1, a fake OpenAI-compatible backend
(``fake_backend``: ``--backend-concurrency`` at once, first token after ``--ttft``, then
``--token-delay`` per token) and a ``tokenfair gateway`` in front of it.  The client (this
process) sends streaming completions with Poisson arrivals at ``--rate`` requests/s for
``--duration`` s; each request goes to the gateway or directly to the backend with
probability 1/2, so both paths see the same backend load in the same run.  Per path it
reports TTFT and end-to-end latency percentiles and the gateway's added latency
(P50/P99 of via-gateway minus direct).  The first ``--warmup`` seconds are excluded (the
gateway's window starts small and grows).  Output: a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _pcts(xs):
    if not xs:
        return None
    a = np.asarray(xs) * 1000.0
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p90_ms": round(float(np.percentile(a, 90)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "n": len(xs)}


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    import httpx
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on port {port}")


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Terminate every process, then kill those still running after ``timeout_s``."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


async def timed_stream(client, url: str, key: str, max_tokens: int) -> tuple[float | None, float] | None:
    """(time to first token or None, end-to-end) of one streamed completion of an 8-word
    prompt at ``url`` (``httpx.AsyncClient`` ``client``); None when it failed."""
    import httpx
    start = time.perf_counter()
    ttft = None
    try:
        async with client.stream("POST", url, headers={"authorization": f"Bearer {key}"},
                                 json={"prompt": "a b c d e f g h", "max_tokens": max_tokens, "stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                return None
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data: ") and '" t0"' in line:
                    ttft = time.perf_counter() - start
    except httpx.HTTPError:
        return None
    return ttft, time.perf_counter() - start


async def _client(args, gw_url: str, be_url: str, key: str) -> dict:
    import httpx

    rng = random.Random(args.seed)
    results = {"direct": [], "gateway": []}
    errors = {"direct": 0, "gateway": 0}
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(at: float, path: str) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            url = (gw_url if path == "gateway" else be_url) + "/v1/completions"
            res = await timed_stream(client, url, key, args.tokens)
            if res is None:
                errors[path] += 1
            elif at >= args.warmup and res[0] is not None:
                results[path].append(res)

        tasks, t = [], 0.0
        while True:
            t += rng.expovariate(args.rate)
            if t > args.duration:
                break
            tasks.append(one(t, "gateway" if rng.random() < 0.5 else "direct"))
        await asyncio.gather(*tasks)
    out = {"errors": errors}
    for path, xs in results.items():
        out[path] = {"ttft": _pcts([x[0] for x in xs]), "e2e": _pcts([x[1] for x in xs])}
    d, g = out["direct"], out["gateway"]
    if d["e2e"] and g["e2e"]:
        out["added_latency_ms"] = {
            "ttft_p50": round(g["ttft"]["p50_ms"] - d["ttft"]["p50_ms"], 2),
            "ttft_p99": round(g["ttft"]["p99_ms"] - d["ttft"]["p99_ms"], 2),
            "e2e_p50": round(g["e2e"]["p50_ms"] - d["e2e"]["p50_ms"], 2),
            "e2e_p99": round(g["e2e"]["p99_ms"] - d["e2e"]["p99_ms"], 2),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50.0, help="requests/s over both paths")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    ap.add_argument("--ttft", type=float, default=0.02, help="backend time to first token (s)")
    ap.add_argument("--token-delay", type=float, default=0.01, help="backend time per further token (s)")
    ap.add_argument("--backend-concurrency", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--role", choices=["bench", "backend"], default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "backend":
        import uvicorn

        from .fake_backend import create_fake_backend
        app = create_fake_backend(args.backend_concurrency, args.token_delay, args.ttft)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        return 0

    from .auth import hash_key
    from .shutdown import free_port
    key = "bench-key"
    be_port, gw_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="tf-overhead-"))
    contract = tmp / "contract.yaml"
    contract.write_text(json.dumps({"tenants": {"bench": {"api_key_sha256": [hash_key(key)], "max_queued": 100000}},
                                    "admission": {"shed_over_max_wait": False}}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "tokenfair.serve.overhead", "--role", "backend", "--port", str(be_port),
                          "--backend-concurrency", str(args.backend_concurrency), "--ttft", str(args.ttft),
                          "--token-delay", str(args.token_delay)], env=env),
        subprocess.Popen([sys.executable, "-c", "from tokenfair.cli.serve import gateway; import typer; "
                          "app = typer.Typer(); app.command()(gateway); app()",
                          "--backend", f"http://127.0.0.1:{be_port}", "--contract", str(contract),
                          "--port", str(gw_port), "--log-level", "warning", "--grace-s", "1"], env=env),
    ]
    try:
        wait_port(be_port)
        wait_port(gw_port)
        res = asyncio.run(_client(args, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{be_port}", key))
    finally:
        stop_processes(procs)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    res["config"] = {k: getattr(args, k) for k in ("rate", "duration", "warmup", "tokens", "ttft", "token_delay",
                                                   "backend_concurrency", "seed")}
    res["cpus"] = os.cpu_count()
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
