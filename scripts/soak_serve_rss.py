"""RSS of ``tokenfair serve`` over a long run of mixed good, big and bad requests.

    .venv/bin/python scripts/soak_serve_rss.py [--seconds 600] [--clients 16] [--out rss.json]

Starts ``tokenfair serve`` (the real PyTorch engine on the test suite's tiny random Llama,
1 model thread, under ``nice -n 10``) on 127.0.0.1 and runs ``--clients`` closed-loop
clients for ``--seconds``.  Each client draws every request from a seeded mix: streamed
completions and chat (varied prompt lengths), non-streamed ones, streams the client drops
after a few chunks, requests of a tenant limited to one at a time (429 ``queue_full``),
and bad ones -- a seed outside the generator's range, invalid JSON, an unsupported
parameter, ``max_tokens`` beyond the context, no API key, a 16 MiB body (declared, and
sent chunked: 413), 1 MiB of chat messages or of token ids (parsed in serve's helper
process: 400).  serve's RSS (``/proc``) is sampled every ``--every`` seconds.

Prints one JSON object: the RSS when idle after start, after the first minute, the median
of the second half ("plateau"), at the end, the maximum, and the slope of a least-squares
line through the second half's samples (MB per minute); the RSS of serve with its child
processes (the body helper) at start, end and maximum; the count of requests by outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_serve import ROOT, TENANTS, free_port, rss_mb, start_server, write_contract  # noqa: E402

BIG_BODY_BYTES = 16 * 1024 * 1024
PARSED_BODY_BYTES = 1024 * 1024        # under the default cap: parsed (in serve's helper process)
BIG_EVERY = 50          # one request in this many (per client) is a big body, one of these kinds:
BIG_KINDS = ("declared", "chunked", "chat", "ids")


def _big(kind: str) -> bytes:
    if kind == "chat":
        msg = b'{"role": "user", "content": "fair share"}, '
        return b'{"max_tokens": 2, "messages": [' + msg * (PARSED_BODY_BYTES // len(msg)) + b'{"role": "user"}]}'
    if kind == "ids":
        return b'{"max_tokens": 2, "prompt": [' + b"7, " * (PARSED_BODY_BYTES // 3) + b"7]}"
    return b'{"prompt": "' + b"x" * BIG_BODY_BYTES + b'", "max_tokens": 2}'


def tree_rss_mb(pid: int) -> float:
    """RSS of ``pid`` and all its descendants (serve's body helper among them)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += rss_mb(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _bad(kind: str, n: int) -> dict | bytes:
    if kind == "seed":
        return {"prompt": "hi", "max_tokens": 3, "seed": 2 ** 64 + 1}
    if kind == "json":
        return b'{"prompt": "hi", "max_tokens": '
    if kind == "unsupported":
        return {"prompt": "hi", "max_tokens": 3, "logprobs": 2}
    return {"prompt": "hi " * (1 + n % 5), "max_tokens": 100_000}      # context_length_exceeded


async def _chunks(body: bytes, size: int = 65536):
    for i in range(0, len(body), size):
        yield body[i:i + size]


async def _one(c: httpx.AsyncClient, url: str, rng: random.Random, n: int) -> str:
    """Send one request of the mix; its outcome ("200", "400", "drop", ...)."""
    tenant = TENANTS[rng.randrange(len(TENANTS))]
    auth = {"Authorization": f"Bearer {tenant}-key"}
    roll = rng.random()
    if n % BIG_EVERY == BIG_EVERY - 1:
        kind = BIG_KINDS[rng.randrange(len(BIG_KINDS))]
        body = _big(kind)
        r = await c.post(url + ("/v1/chat/completions" if kind == "chat" else "/v1/completions"),
                         content=_chunks(body) if kind == "chunked" else body,
                         headers={**auth, "content-type": "application/json"})
        return f"{r.status_code}:big-{kind}"
    if roll < 0.10:
        kind = ("seed", "json", "unsupported", "context")[n % 4]
        body = _bad(kind, n)
        kw = {"content": body, "headers": {**auth, "content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body, "headers": auth}
        r = await c.post(url + "/v1/completions", **kw)
        return f"{r.status_code}:{kind}"
    if roll < 0.13:
        r = await c.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        return f"{r.status_code}:nokey"
    if roll < 0.20:        # "limited" takes one request at a time and queues one: 429 under load
        r = await c.post(url + "/v1/completions", headers={"Authorization": "Bearer limited-key"},
                         json={"prompt": "limited", "max_tokens": 16, "ignore_eos": True})
        return f"{r.status_code}:limited"
    words = "fair scheduling shares tokens between tenants " * (1 + rng.randrange(5))   # <= ~160 of 256 tokens
    chat = roll < 0.40
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": rng.randrange(4, 64), "ignore_eos": True, "stream": roll >= 0.30}
    body.update({"messages": [{"role": "user", "content": words}]} if chat else {"prompt": words})
    if not body["stream"]:
        r = await c.post(url + path, headers=auth, json=body)
        return str(r.status_code)
    drop = roll >= 0.90
    async with c.stream("POST", url + path, headers=auth, json=body) as r:
        chunks = 0
        async for line in r.aiter_lines():
            chunks += line.startswith("data: ")
            if drop and chunks >= 3:
                return "drop"
        return str(r.status_code)


async def run_load(url: str, pid: int, seconds: float, clients: int, every: float, seed: int,
                   samples: list[tuple[float, float]]) -> dict:
    samples.append((0.0, rss_mb(pid)))
    tree: list[float] = [tree_rss_mb(pid)]
    outcomes: Counter = Counter()
    t0 = time.perf_counter()
    end = t0 + seconds

    async def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        n = 0
        async with httpx.AsyncClient(timeout=120) as c:
            while time.perf_counter() < end:
                try:
                    outcomes[await _one(c, url, rng, n)] += 1
                except httpx.HTTPError as err:
                    outcomes[type(err).__name__] += 1
                n += 1

    async def sampler() -> None:
        while time.perf_counter() < end:
            await asyncio.sleep(every)
            samples.append((time.perf_counter() - t0, rss_mb(pid)))
            tree.append(tree_rss_mb(pid))

    await asyncio.gather(sampler(), *[client(i) for i in range(clients)])
    return summarize(samples, seconds) | {
        "with_children_mb_start": round(tree[0], 1), "with_children_mb_end": round(tree[-1], 1),
        "with_children_mb_max": round(max(tree), 1),
        "requests": sum(outcomes.values()), "outcomes": dict(sorted(outcomes.items()))}


def summarize(samples: list[tuple[float, float]], seconds: float) -> dict:
    """start / first minute / plateau (median of the second half) / end / max, and the slope
    (MB per minute) of the least-squares line through the second half."""
    half = [(t, m) for t, m in samples if t >= seconds / 2]
    minute = next((m for t, m in samples if t >= 60), samples[-1][1])
    slope = 0.0
    if len(half) >= 2:
        mt = statistics.fmean(t for t, _ in half)
        mm = statistics.fmean(m for _, m in half)
        var = sum((t - mt) ** 2 for t, _ in half)
        slope = 60 * sum((t - mt) * (m - mm) for t, m in half) / var if var > 0 else 0.0
    return {"seconds": seconds, "samples": len(samples), "rss_mb_start": round(samples[0][1], 1),
            "rss_mb_after_1_min": round(minute, 1),
            "rss_mb_plateau": round(statistics.median(m for _, m in half), 1) if half else None,
            "rss_mb_end": round(samples[-1][1], 1), "rss_mb_max": round(max(m for _, m in samples), 1),
            "slope_mb_per_min_second_half": round(slope, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the result (with all samples) here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from conftest import make_tiny_llama     # the test suite's tiny random Llama (256 positions)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_tiny_llama(folder / "model")
        contract = write_contract(folder, extra={"limited": {"max_concurrency": 1, "max_queued": 1}})
        port = free_port()
        proc = start_server(["serve", "--model", str(folder / "model"), "--contract", str(contract), "--threads", "1",
                       "--served-model-name", "tiny", "--kv-tokens", "16384"], port, nice=10)
        try:
            time.sleep(2.0)
            samples: list = []
            out = asyncio.run(run_load(f"http://127.0.0.1:{port}", proc.pid, args.seconds, args.clients,
                                       args.every, args.seed, samples))
        finally:
            proc.kill()
            proc.wait(10)
    if args.out is not None:
        args.out.write_text(json.dumps({**out, "rss_samples": samples}))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
