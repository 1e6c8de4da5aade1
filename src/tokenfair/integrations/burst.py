"""A bounded burst workload against an OpenAI-compatible server (vLLM, or the gateway in
front of it), measured per tenant: the proof and benchmark driver for docs/VLLM.md.

Each tenant sends ``count`` streamed completions (greedy, ``ignore_eos`` so every request
generates exactly ``max_tokens``), the first at ``start_s`` and then every ``spacing_s``.
The tenant is named in ``vllm_xargs`` (direct to vLLM) or by an API key (through the
gateway, which then sets ``vllm_xargs`` itself).  Per request it records when it was sent,
its first token, every later token and the server's ``usage``; :func:`summarize` turns
that into throughput, per-tenant TTFT percentiles, and each tenant's share of the service
(``prefill x prompt + decode x output`` cost) while the tenants named in ``share_of`` were
all backlogged (being served, with requests not yet started), in generated tokens.  Every request ends finished or failed with a
reason; failures are counted next to the throughput.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

FILLER = "The quick brown fox jumps over the lazy dog while the tired cat sleeps in the warm sun. "
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TenantLoad:
    tenant: str
    count: int                     # requests (> 0)
    prompt_sentences: int          # filler sentences per prompt (about 20 tokens each)
    max_tokens: int                # generated tokens per request (ignore_eos)
    start_s: float = 0.0           # first send, seconds after the run starts
    spacing_s: float = 0.0         # between this tenant's sends
    klass: str | None = None       # vllm_xargs.class (direct) or the tokenfair class (gateway)


@dataclass
class Result:
    tenant: str
    index: int
    sent_s: float
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)   # arrival of each streamed text chunk
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    status: str = "pending"        # finished | failed
    reason: str = ""


def prompt_for(tenant: str, index: int, sentences: int) -> str:
    return f"Request {index} of {tenant}. " + FILLER * sentences


def _body(load: TenantLoad, index: int, model: str, key: str | None) -> dict:
    body = {"model": model, "prompt": prompt_for(load.tenant, index, load.prompt_sentences),
            "max_tokens": load.max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if key is None:
        xargs = {"tenant": load.tenant}
        if load.klass:
            xargs["class"] = load.klass
        body["vllm_xargs"] = xargs
    elif load.klass:
        body["tokenfair"] = {"class": load.klass}
    return body


async def _one(client, url: str, load: TenantLoad, index: int, t0: float, model: str,
               key: str | None) -> Result:
    await asyncio.sleep(max(0.0, t0 + load.start_s + index * load.spacing_s - time.monotonic()))
    res = Result(load.tenant, index, time.monotonic() - t0)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        async with client.stream("POST", url + "/v1/completions", json=_body(load, index, model, key),
                                 headers=headers, timeout=REQUEST_TIMEOUT_S) as r:
            if r.status_code != 200:
                res.status, res.reason = "failed", f"http {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    res.status, res.reason = "failed", f"stream error: {chunk['error']}"
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                    res.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                for c in chunk.get("choices") or []:
                    if c.get("text"):
                        now = time.monotonic() - t0
                        if res.first_token_s is None:
                            res.first_token_s = now
                        res.token_s.append(now)
                        res.text += c["text"]
        res.status = "finished" if res.first_token_s is not None else "failed"
        res.reason = res.reason or ("" if res.status == "finished" else "no token streamed")
    except Exception as err:  # noqa: BLE001 - every request ends with a reason
        res.status, res.reason = "failed", f"{type(err).__name__}: {err}"
    return res


async def run_burst_async(url: str, loads: list[TenantLoad], model: str = "smollm2",
                          keys: dict[str, str] | None = None) -> list[Result]:
    import httpx
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.monotonic()
        tasks = [_one(client, url.rstrip("/"), ld, i, t0, model, (keys or {}).get(ld.tenant) if keys else None)
                 for ld in loads for i in range(ld.count)]
        return list(await asyncio.gather(*tasks))


def run_burst(url: str, loads: list[TenantLoad], model: str = "smollm2",
              keys: dict[str, str] | None = None) -> list[Result]:
    return asyncio.run(run_burst_async(url, loads, model, keys))


def run_in_turn(urls: dict[str, str], loads: list[TenantLoad], rounds: int, model: str = "smollm2",
                keys: dict[str, dict[str, str] | None] | None = None,
                rest_s: float = 0.0) -> dict[str, list[list[Result]]]:
    """The same workload on each server alone, one after the other, ``rounds`` times, the order
    reversed every other round (A B, B A, ...), so a drift in the machine's other load falls on
    both sides alike.  Each server has the machine to itself while it runs: two servers side
    by side share its CPUs unevenly (each one's API process, tokenizer and engine compete with
    the other's).  ``keys``: per server name, or none.  ``rest_s``: a server's run starts at
    least this long after its previous one ended (the reversal puts a server's runs back to
    back at each round's turn), so a scheduler that remembers recent service (the fair
    policy's share meter) starts each run from the same rested state."""
    out: dict[str, list[list[Result]]] = {name: [] for name in urls}
    names = list(urls)
    last_end: dict[str, float] = {}
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            if name in last_end:
                time.sleep(max(0.0, last_end[name] + rest_s - time.monotonic()))
            out[name].append(run_burst(urls[name], loads, model, (keys or {}).get(name)))
            last_end[name] = time.monotonic()
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def backlogged_window(results: list[Result], tenants: tuple[str, ...]) -> tuple[float, float]:
    """[start, end]: every tenant in ``tenants`` is being served (its first request started)
    and still has a request waiting (sent, not started).  Starting at the first token rather
    than the send keeps the server's own intake delay (tokenising a burst) out of the shares."""
    start, end = 0.0, math.inf
    for t in tenants:
        mine = [r for r in results if r.tenant == t and r.first_token_s is not None]
        if not mine:
            return (0.0, 0.0)
        start = max(start, min(r.first_token_s for r in mine))
        end = min(end, max(r.first_token_s for r in mine))
    return (start, max(start, end))


def saturated_until(results: list[Result], slots: int) -> float:
    """When fewer than ``slots`` requests were left unfinished (the drain begins): up to then
    the server had at least as much work as it runs at once."""
    ends = sorted(r.token_s[-1] for r in results if r.token_s)
    missing = len(results) - len(ends)                # failed: never counted as outstanding
    k = len(ends) - slots + missing
    return ends[k] if 0 <= k < len(ends) else (ends[-1] if ends else 0.0)


def tokens_between(results: list[Result], lo: float, hi: float) -> int:
    return sum(1 for r in results for t in r.token_s if lo <= t <= hi)


def service_in(results: list[Result], window: tuple[float, float], prefill: float = 1.0,
               decode: float = 2.0) -> dict[str, float]:
    """Cost served per tenant inside ``window``: a request's prompt at its first token, each
    generated token when it streamed.  The end is exclusive: the request whose start ends the
    window (its tenant's last) is not counted for it."""
    lo, hi = window
    out: dict[str, float] = {}
    for r in results:
        cost = 0.0
        if r.first_token_s is not None and lo <= r.first_token_s < hi:
            cost += prefill * r.prompt_tokens
        cost += decode * sum(1 for t in r.token_s if lo <= t < hi)
        out[r.tenant] = out.get(r.tenant, 0.0) + cost
    return out


def summarize(results: list[Result], share_of: tuple[str, ...] = (), slots: int | None = None) -> dict:
    """Throughput (and, with ``slots``, the throughput while the server was saturated: the
    drain at the end depends on the order requests ran in, not on the server's speed),
    per-tenant TTFT, and the shares of ``share_of`` while all of them were backlogged."""
    ok = [r for r in results if r.status == "finished"]
    end = max((r.token_s[-1] for r in ok if r.token_s), default=0.0)
    tokens = sum(r.output_tokens or len(r.token_s) for r in ok)
    per: dict[str, dict] = {}
    for t in sorted({r.tenant for r in results}):
        mine = [r for r in results if r.tenant == t]
        ttft = [r.first_token_s - r.sent_s for r in mine if r.first_token_s is not None]
        per[t] = {"requests": len(mine), "failed": sum(r.status != "finished" for r in mine),
                  "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
                  "output_tokens": sum(r.output_tokens for r in mine)}
    out = {"requests": len(results), "failed": len(results) - len(ok), "output_tokens": tokens,
           "makespan_s": end, "throughput_tok_s": tokens / end if end > 0 else 0.0, "tenants": per,
           "failures": sorted({r.reason for r in results if r.status != "finished"})}
    if slots is not None:
        until = saturated_until(results, slots)
        out["saturated_s"] = until
        out["saturated_tok_s"] = tokens_between(results, 0.0, until) / until if until > 0 else 0.0
    if share_of:
        window = backlogged_window(results, share_of)
        # generated tokens: the prompt of a request counts at one instant (its first token),
        # which makes short windows lumpy; the heavy tenants' requests are alike, so their
        # token shares are their cost shares
        served = service_in(results, window, prefill=0.0, decode=1.0)
        total = sum(served.get(t, 0.0) for t in share_of)
        out["backlogged_window_s"] = list(window)
        out["shares"] = {t: (served.get(t, 0.0) / total if total else math.nan) for t in share_of}
    return out
