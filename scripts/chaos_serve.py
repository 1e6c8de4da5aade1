"""Chaos checks of ``tokenfair serve`` and ``tokenfair gateway`` as separate processes on
127.0.0.1 (a tiny random Llama built on the fly); prints one JSON object.

    .venv/bin/python scripts/chaos_serve.py [--streams 50] [--repeat 3] [--only PHASE]

  poison   ``--streams`` streams from 10 tenants, plus one request with the seed that once
           failed a whole batch (2^64 + 1): it gets its 400 alone, every stream finishes;
  big_body 16 MiB bodies (declared, chunked, and parsed by a server with a 32 MiB cap, and
           by a gateway with that cap in front of it) while 20 streams run: the largest gap between two chunks of any stream while the body
           is sent and answered, next to a window of the same length just after
           (``scripts/chaos_big_body.py``; ``--repeat`` runs each, medians);
  sigstop  two serve backends behind a gateway (probe interval 1 s, timeout 1.5 s, 2
           failures): streams through the gateway, one backend SIGSTOPped; seconds until the
           gateway reports it down, and how the requests ended;

serve's RSS over a long mixed run is ``scripts/soak_serve_rss.py``.
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

from chaos_big_body import BIG_CAP_BYTES, VARIANTS, big_body

ROOT = Path(__file__).resolve().parents[1]
TENANTS = [f"t{i}" for i in range(10)]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_server(args: list[str], port: int, nice: int = 0) -> subprocess.Popen:
    prefix = ["nice", "-n", str(nice)] if nice else []
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "tokenfair", *args, "--port", str(port), "--log-level", "warning"],
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


async def stream(client, url, tenant, max_tokens=48, prompt="fair scheduling shares tokens"):
    """(status, [chunk arrival times]); status is -1 for a 200 whose stream did not end in
    ``finish_reason: length`` with ``max_tokens`` tokens."""
    stamps: list[float] = []
    done = False
    async with client.stream("POST", url + "/v1/completions", headers={"Authorization": f"Bearer {tenant}-key"},
                             json={"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                                   "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            print(f"{tenant}: {r.status_code} {(await r.aread())[:300]!r}", file=sys.stderr)
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.monotonic())
                chunk = json.loads(line[6:])
                if (chunk.get("usage") or {}).get("completion_tokens") == max_tokens:
                    done = True
        return (r.status_code if done or r.status_code != 200 else -1), stamps


async def poison(url: str, n: int) -> dict:
    async with httpx.AsyncClient(timeout=120) as c:
        tasks = [asyncio.ensure_future(stream(c, url, TENANTS[i % 10])) for i in range(n)]
        await asyncio.sleep(0.5)
        bad = await c.post(url + "/v1/completions", headers={"Authorization": "Bearer t0-key"},
                           json={"prompt": "hi", "max_tokens": 3, "seed": 2 ** 64 + 1, "temperature": 1.0})
        res = await asyncio.gather(*tasks)
    return {"poison_status": bad.status_code, "poison_param": bad.json()["error"].get("param"),
            "streams": n, "streams_ok": sum(1 for s, _ in res if s == 200)}


async def sigstop(gw_url: str, victim: subprocess.Popen, n: int = 20) -> dict:
    async with httpx.AsyncClient(timeout=180) as c:
        tasks = [asyncio.ensure_future(c.post(gw_url + "/v1/completions", headers={"Authorization": f"Bearer t{i % 10}-key"},
                                              json={"prompt": "fair scheduling", "max_tokens": 96, "ignore_eos": True}))
                 for i in range(n)]
        await asyncio.sleep(1.0)
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        detected = None
        while time.monotonic() - t0 < 30:
            h = (await c.get(gw_url + "/healthz")).json()
            if h.get("backends_down"):
                detected = time.monotonic() - t0
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


def write_contract(folder: Path, extra: dict | None = None) -> Path:
    """Tenants t0..t9 (key ``<tenant>-key``), plus ``extra`` tenants (name -> spec)."""
    import yaml
    from tokenfair.serve.auth import hash_key
    tenants = {t: {"api_key_sha256": [hash_key(f"{t}-key")]} for t in TENANTS}
    for name, spec in (extra or {}).items():
        tenants[name] = {**spec, "api_key_sha256": [hash_key(f"{name}-key")]}
    path = folder / "contract.yaml"
    path.write_text(yaml.safe_dump({"version": "chaos", "tenants": tenants}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each big_body variant (medians)")
    ap.add_argument("--only", choices=("poison", "big_body", "sigstop"), default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="big_body variants, comma-separated")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from conftest import make_tiny_llama     # the test suite's tiny random Llama (256 positions)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_tiny_llama(folder / "model")
        contract = write_contract(folder, {"big": {}})     # "big" sends the big bodies (chaos_big_body.py)
        serve_args = ["serve", "--model", str(folder / "model"), "--contract", str(contract), "--threads", "1",
                      "--served-model-name", "tiny", "--kv-tokens", "16384"]
        ports = [free_port() for _ in range(4)]
        procs = [start_server(serve_args, ports[0]),
                 start_server([*serve_args, "--max-body-bytes", str(BIG_CAP_BYTES)], ports[1])]
        try:
            url = f"http://127.0.0.1:{ports[0]}"
            out["rss_mb_fresh"] = round(rss_mb(procs[0].pid), 1)
            big_cap_url = f"http://127.0.0.1:{ports[1]}"
            gw_url = f"http://127.0.0.1:{ports[3]}"
            if args.only in (None, "big_body") and any(v.startswith("gw-") for v in args.variants.split(",")):
                procs.append(start_server(["gateway", "--contract", str(contract), "--backend", big_cap_url,
                                           "--max-body-bytes", str(BIG_CAP_BYTES)], ports[3]))
            phases = {"poison": lambda: poison(url, args.streams),
                      "big_body": lambda: big_body(url, big_cap_url, gw_url, args.repeat, args.variants.split(","))}
            for name, phase in phases.items():
                if args.only in (None, name):
                    out[name] = asyncio.run(phase())
            if args.only not in (None, "sigstop"):
                return print(json.dumps(out))
            gw = start_server(["gateway", "--contract", str(contract), "--backend", url, "--backend",
                               big_cap_url, "--backend-key", "t0-key"], ports[2])
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
