"""The ``big_body`` phase of ``scripts/chaos_serve.py``: 16 MiB bodies sent to ``serve``
while 20 streams of other tenants run; the largest gap between two chunks of any of those
streams from the body's first byte to 0.5 s after its answer, next to the largest gap in
a window of the same length starting 0.5 s after that (same streams, same run).

Variants (the body comes from a separate process, so its upload costs the measuring
client nothing):

  declared  a 16 MiB completion prompt with its ``Content-Length``, to a server with the
            default body cap (4 MiB): refused (413) from the header;
  chunked   the same body sent chunked (no ``Content-Length``): 413 once 4 MiB are read;
  parsed    the same body to a server started with ``--max-body-bytes 32 MiB``: read,
            parsed, then refused by the prompt-length pre-check (400 context_length_exceeded);
  chat      16 MiB of chat messages (~160,000 messages) to that server: parsed, validated,
            refused by the pre-check;
  ids       a 16 MiB prompt of token ids (~4 million) to that server: parsed, validated,
            refused by its length;
  gw-chat, gw-ids  the chat and ids bodies to a gateway (``--max-body-bytes 32 MiB``, no
            ``--max-context``) in front of that server, the 20 streams going through the
            gateway too: the gateway's helper process parses the body and the gateway
            forwards its prompt as bytes; the backend refuses it (400, passed on).

    .venv/bin/python scripts/chaos_serve.py --only big_body --repeat 3

With ``TOKENFAIR_LOOP_LAG_MS`` (and ``TOKENFAIR_LOOP_LAG_FILE``) set, the servers and this
client run the loop-lag probe (``tokenfair.serve.loop_lag``; the client's lines go to the
file with ``.client`` appended), and each run names when its largest gap ended
(``gap_end_monotonic``) to match against the probes' lines.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import httpx

BIG_BYTES = 16 * 1024 * 1024
VARIANTS = ("declared", "chunked", "parsed", "chat", "ids", "gw-chat", "gw-ids")
BIG_CAP_BYTES = 32 * 1024 * 1024        # --max-body-bytes of the server the parsed variants go to
NUM_STREAMS = 20
SETTLE_S = 0.5          # the "during" window ends this long after the answer
SENDER = "big"          # the tenant sending the big bodies (none of the streams' tenants)


def big_body_bytes(variant: str) -> bytes:
    variant = variant.removeprefix("gw-")
    if variant == "chat":
        msg = '{"role": "user", "content": "' + "fair share " * 9 + '"}, '
        n = BIG_BYTES // len(msg)
        return ('{"max_tokens": 2, "messages": [' + msg * n + '{"role": "user", "content": "end"}]}').encode()
    if variant == "ids":
        n = BIG_BYTES // 4
        return ('{"max_tokens": 2, "prompt": [' + "99, " * n + "5]}").encode()
    return b'{"prompt": "' + b"x" * BIG_BYTES + b'", "max_tokens": 2}'


def send(url: str, variant: str) -> None:
    """Run in a separate process: POST the variant's body; print start, end, status, code."""
    body = big_body_bytes(variant)
    path = "/v1/chat/completions" if variant.endswith("chat") else "/v1/completions"
    content = (body[i:i + 65536] for i in range(0, len(body), 65536)) if variant == "chunked" else body
    t0 = time.monotonic()
    r = httpx.post(url + path, content=content, timeout=120,
                   headers={"Authorization": f"Bearer {SENDER}-key", "content-type": "application/json"})
    t1 = time.monotonic()
    print(json.dumps({"t0": t0, "t1": t1, "status": r.status_code, "code": r.json()["error"]["code"]}))


async def _streams_until(c, url: str, stop: list, stamps: list) -> None:
    """``NUM_STREAMS`` closed-loop streams of 10 tenants until ``stop`` is set; each finished
    stream's chunk times are appended to ``stamps``."""
    from chaos_serve import TENANTS, stream

    async def worker(i: int) -> None:
        while not stop:
            status, s = await stream(c, url, TENANTS[i % 10], 200)
            if status != 200:
                raise RuntimeError(f"a stream of tenant {TENANTS[i % 10]} ended with {status}")
            stamps.append(s)
    await asyncio.gather(*[worker(i) for i in range(NUM_STREAMS)])


def _max_gap(stamps_list, lo: float, hi: float) -> tuple[float, float]:
    """(largest gap between two chunks ending in [lo, hi], when it ended)."""
    gaps = [(b - a, b) for s in stamps_list for a, b in zip(s, s[1:]) if lo <= b <= hi]
    return max(gaps, default=(0.0, 0.0))


def _client_probe():
    import os

    from tokenfair.serve.loop_lag import ENV_FILE, ENV_THRESHOLD_MS, LoopLagProbe
    if not os.environ.get(ENV_THRESHOLD_MS):
        return None
    path = os.environ.get(ENV_FILE)
    return LoopLagProbe(float(os.environ[ENV_THRESHOLD_MS]) / 1000, path + ".client" if path else None)


async def one_variant(url: str, variant: str) -> dict:
    stop: list = []
    stamps: list = []
    probe = _client_probe()
    probe_task = asyncio.ensure_future(probe.run()) if probe is not None else None
    async with httpx.AsyncClient(timeout=120) as c:
        streams = asyncio.ensure_future(_streams_until(c, url, stop, stamps))
        await asyncio.sleep(2.0)
        proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--send", url, variant,
                                                    stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        sent = json.loads(out)
        t0, t1 = sent["t0"], sent["t1"] + SETTLE_S
        span = t1 - t0
        await asyncio.sleep(max(0.0, t1 + span + SETTLE_S - time.monotonic()))
        stop.append(1)
        await streams
    if probe is not None:
        probe.stop()
        probe_task.cancel()
    during, end = _max_gap(stamps, t0, t1)
    return {"status": sent["status"], "code": sent["code"], "answer_s": round(sent["t1"] - sent["t0"], 3),
            "max_gap_ms_during": round(1000 * during, 1), "gap_end_monotonic": round(end, 4),
            "max_gap_ms_after": round(1000 * _max_gap(stamps, t1 + SETTLE_S, t1 + SETTLE_S + span)[0], 1)}


async def big_body(url_default_cap: str, url_big_cap: str, url_gateway: str, repeat: int,
                   variants=VARIANTS) -> dict:
    """Each variant ``repeat`` times; the runs and the median of each figure."""
    from tokenfair.serve.heap import freeze_startup_heap
    freeze_startup_heap()       # this client imported torch (the tiny model): its full collections were 0.4 s
    out: dict = {}
    for variant in variants:
        url = (url_default_cap if variant in ("declared", "chunked") else
               url_gateway if variant.startswith("gw-") else url_big_cap)
        runs = [await one_variant(url, variant) for _ in range(repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("answer_s", "max_gap_ms_during", "max_gap_ms_after")}
        out[variant] = {"status": runs[0]["status"], "code": runs[0]["code"], "median": med,
                        "runs": [{k: r[k] for k in (*med, "gap_end_monotonic")} for r in runs]}
        print(json.dumps({variant: out[variant]}), file=sys.stderr)
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--send"]:
    send(sys.argv[2], sys.argv[3])
