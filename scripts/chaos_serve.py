"""Chaos checks of ``tokenfair serve`` and ``tokenfair gateway`` as separate processes on
127.0.0.1 (a tiny random Llama built on the fly); prints one JSON object.

    .venv/bin/python scripts/chaos_serve.py [--streams 50] [--rss-seconds 120]

  poison   ``--streams`` streams from 10 tenants, plus one request with the seed that once
           failed a whole batch (2^64 + 1): it gets its 400 alone, every stream finishes;
  big_body 20 streams, then a 16 MiB body: the largest gap between two chunks of any stream
           while the body is sent and refused, next to the largest gap without it;
  sigstop  two serve backends behind a gateway (probe interval 1 s, timeout 1.5 s, 2
           failures): streams through the gateway, one backend SIGSTOPped; seconds until the
           gateway reports it down, and how the requests ended;
  rss      serve's RSS (from /proc) sampled while a closed loop of requests runs for
           ``--rss-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TENANTS = [f"t{i}" for i in range(10)]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _start(args: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tokenfair", *args, "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 503):
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args[0]} on port {port} did not start")


async def _stream(client, url, tenant, max_tokens=48, prompt="fair scheduling shares tokens"):
    """(status, [chunk arrival times]); status is -1 for a 200 whose stream did not end in
    ``finish_reason: length`` with ``max_tokens`` tokens."""
    stamps: list[float] = []
    done = False
    async with client.stream("POST", url + "/v1/completions", headers={"Authorization": f"Bearer {tenant}-key"},
                             json={"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                                   "stream_options": {"include_usage": True}}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
                chunk = json.loads(line[6:])
                if (chunk.get("usage") or {}).get("completion_tokens") == max_tokens:
                    done = True
        return (r.status_code if done or r.status_code != 200 else -1), stamps


def _max_gap(stamps_list, lo=0.0, hi=float("inf")) -> float:
    gaps = [b - a for s in stamps_list for a, b in zip(s, s[1:]) if lo <= b <= hi]
    return max(gaps, default=0.0)


async def poison(url: str, n: int) -> dict:
    async with httpx.AsyncClient(timeout=120) as c:
        tasks = [asyncio.ensure_future(_stream(c, url, TENANTS[i % 10])) for i in range(n)]
        await asyncio.sleep(0.5)
        bad = await c.post(url + "/v1/completions", headers={"Authorization": "Bearer t0-key"},
                           json={"prompt": "hi", "max_tokens": 3, "seed": 2 ** 64 + 1, "temperature": 1.0})
        res = await asyncio.gather(*tasks)
    return {"poison_status": bad.status_code, "poison_param": bad.json()["error"].get("param"),
            "streams": n, "streams_ok": sum(1 for s, _ in res if s == 200)}


async def _poll_health(c, url, until: list) -> list[tuple[float, float]]:
    """(sent at, seconds) of /healthz calls every 20 ms until ``until`` is set."""
    out = []
    while not until:
        t = time.perf_counter()
        await c.get(url + "/healthz")
        out.append((t, time.perf_counter() - t))
        await asyncio.sleep(0.02)
    return out


async def big_body(url: str) -> dict:
    body = b'{"prompt": "' + b"x" * (16 * 1024 * 1024) + b'", "max_tokens": 2}'
    async with httpx.AsyncClient(timeout=120) as c:
        stop: list = []
        poller = asyncio.ensure_future(_poll_health(c, url, stop))
        base = await asyncio.gather(*[_stream(c, url, TENANTS[i % 10], 64) for i in range(20)])
        tasks = [asyncio.ensure_future(_stream(c, url, TENANTS[i % 10], 96)) for i in range(20)]
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        r = await c.post(url + "/v1/completions", content=body, headers={"Authorization": "Bearer t0-key",
                                                                         "content-type": "application/json"})
        t1 = time.perf_counter()
        res = await asyncio.gather(*tasks)
        stop.append(1)
        health = await poller
    during = [d for t, d in health if t0 - 0.02 <= t <= t1 + 0.5]
    before = [d for t, d in health if t < t0 - 0.02]
    return {"status": r.status_code, "code": r.json()["error"]["code"], "answer_s": round(t1 - t0, 3),
            "max_gap_ms_during": round(1000 * _max_gap([s for _, s in res], t0, t1 + 0.5), 1),
            "max_gap_ms_baseline": round(1000 * _max_gap([s for _, s in base]), 1),
            "healthz_max_ms_during": round(1000 * max(during, default=0.0), 1),
            "healthz_max_ms_before": round(1000 * max(before, default=0.0), 1)}


async def sigstop(gw_url: str, victim: subprocess.Popen, n: int = 20) -> dict:
    async with httpx.AsyncClient(timeout=180) as c:
        tasks = [asyncio.ensure_future(c.post(gw_url + "/v1/completions", headers={"Authorization": f"Bearer t{i % 10}-key"},
                                              json={"prompt": "fair scheduling", "max_tokens": 96, "ignore_eos": True}))
                 for i in range(n)]
        await asyncio.sleep(1.0)
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.perf_counter()
        detected = None
        while time.perf_counter() - t0 < 30:
            h = (await c.get(gw_url + "/healthz")).json()
            if h.get("backends_down"):
                detected = time.perf_counter() - t0
                break
            await asyncio.sleep(0.05)
        res = await asyncio.gather(*tasks, return_exceptions=True)
    os.kill(victim.pid, signal.SIGCONT)
    ends: dict[str, int] = {}
    for r in res:
        key = str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__
        if isinstance(r, httpx.Response) and r.status_code != 200:
            key += ":" + str(r.json()["error"].get("code"))
        ends[key] = ends.get(key, 0) + 1
    return {"detected_down_s": None if detected is None else round(detected, 2), "requests": n, "ended": ends}


async def rss(url: str, pid: int, seconds: float) -> dict:
    samples = [_rss_mb(pid)]
    end = time.perf_counter() + seconds
    done = 0
    async with httpx.AsyncClient(timeout=120) as c:
        async def worker(i):
            nonlocal done
            while time.perf_counter() < end:
                await _stream(c, url, TENANTS[i % 10], 32, prompt="the quick brown fox " * (1 + i % 8))
                done += 1

        async def sampler():
            while time.perf_counter() < end:
                await asyncio.sleep(5)
                samples.append(_rss_mb(pid))
        await asyncio.gather(sampler(), *[worker(i) for i in range(16)])
    return {"seconds": seconds, "requests": done, "rss_mb_start": round(samples[0], 1),
            "rss_mb_after_first_sample": round(samples[min(1, len(samples) - 1)], 1),
            "rss_mb_end": round(samples[-1], 1), "rss_mb_max": round(max(samples), 1)}


def _contract(folder: Path) -> Path:
    import yaml
    from tokenfair.serve.auth import hash_key
    tenants = {t: {"api_key_sha256": [hash_key(f"{t}-key")]} for t in TENANTS}
    path = folder / "contract.yaml"
    path.write_text(yaml.safe_dump({"version": "chaos", "tenants": tenants}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--rss-seconds", type=float, default=120.0)
    ap.add_argument("--only", choices=("poison", "big_body", "rss", "sigstop"), default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from conftest import make_tiny_llama     # the test suite's tiny random Llama (256 positions)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_tiny_llama(folder / "model")
        contract = _contract(folder)
        serve_args = ["serve", "--model", str(folder / "model"), "--contract", str(contract), "--threads", "1",
                      "--served-model-name", "tiny", "--kv-tokens", "16384"]
        ports = [_free_port() for _ in range(3)]
        procs = [_start(serve_args, ports[0]), _start(serve_args, ports[1])]
        try:
            url = f"http://127.0.0.1:{ports[0]}"
            out["rss_mb_fresh"] = round(_rss_mb(procs[0].pid), 1)
            phases = {"poison": lambda: poison(url, args.streams), "big_body": lambda: big_body(url),
                      "rss": lambda: rss(url, procs[0].pid, args.rss_seconds)}
            for name, phase in phases.items():
                if args.only in (None, name):
                    out[name] = asyncio.run(phase())
            if args.only not in (None, "sigstop"):
                return print(json.dumps(out))
            gw = _start(["gateway", "--contract", str(contract), "--backend", url, "--backend",
                         f"http://127.0.0.1:{ports[1]}", "--backend-key", "t0-key"], ports[2])
            procs.append(gw)
            out["sigstop"] = asyncio.run(sigstop(f"http://127.0.0.1:{ports[2]}", procs[1]))
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
