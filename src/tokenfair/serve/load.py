"""``tokenfair load``: replay a trace against any OpenAI-compatible endpoint over real HTTP.

Per trace row, at ``arrival_s x time_scale`` seconds after the start, one streaming
request (httpx, asyncio) is sent to ``{url}/v1/completions`` (or ``/v1/chat/completions``)
with the tenant's API key (``--keys``: a YAML/JSON mapping tenant -> key; a ``"*"`` entry
is used for tenants without their own), and:

  * a prompt synthesised to about ``prompt_tokens`` tokens: that many common short English
    words, drawn with a generator seeded by (seed, request id) -- most BPE tokenizers
    give one token per such word; the server's ``usage.prompt_tokens`` is recorded;
  * ``max_tokens = output_tokens`` and ``ignore_eos: true`` (vLLM and tokenfair honour it;
    others ignore it and may stop early), ``stream_options.include_usage``;
  * the row's class / deadline / priority as ``x-tokenfair-*`` headers.

Measured client-side, per request: first token time (first chunk with text), finish time,
output tokens (``usage.completion_tokens``, else the number of text chunks), HTTP status.
Records have the simulator's fields (``metrics.request_record``); ``scheduled_s`` is the
first-token time (a client cannot see admission), times are seconds since the start.
Status: 200 -> finished; 400/403/404/413/429/503 -> rejected; 504 or a deadline code ->
expired; other statuses, stream errors, timeouts and connection errors -> failed; the
reason is the server's error code and message.

The timeline has :meth:`tokenfair.runtime.recorder.Recorder.to_json`'s schema: per tenant and class,
cost-weighted service per 1 s bucket (prompt cost at the first token, decode cost at each
token's arrival), so ``metrics.summarize`` computes the same fairness metrics as for
``simulate``.  Output: ``requests.jsonl``, ``summary.json``, ``timeline.json``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx
import numpy as np
import yaml

from ..contracts.contract import Contract
from ..workloads.workload import TraceRow
from .load_request import load_record, request_of, stream_once
from .load_timeline import build_timeline

def load_keys(path: str | Path) -> dict[str, str]:
    """tenant -> API key from a YAML or JSON mapping."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise FileNotFoundError(f"{p}: cannot read the keys file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{p}: not valid YAML/JSON: {err}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{p}: the keys file must be a non-empty mapping tenant -> API key")
    out = {}
    for k, v in data.items():
        if not isinstance(v, str) or not v:
            raise ValueError(f"{p}: key of tenant {k!r} must be a non-empty string")
        out[str(k)] = v
    return out


def base_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ValueError(f"url {url!r}: expected http(s)://host:port")
    return u.removesuffix("/v1")


def spread_over(urls: Sequence[str], rows: Sequence[TraceRow]) -> dict[str, str]:
    """request id -> base URL: tenant t's n-th request goes to ``urls[(n + k_t) % len(urls)]``,
    k_t the tenant's rank by name, so each tenant's requests are spread evenly over every URL
    (a fleet of gateways behind no load balancer) and the tenants start on different ones."""
    rank = {t: i for i, t in enumerate(sorted({r.tenant for r in rows}))}
    seen: dict[str, int] = {}
    out = {}
    for r in rows:
        n = seen.get(r.tenant, 0)
        seen[r.tenant] = n + 1
        out[r.request_id] = urls[(n + rank[r.tenant]) % len(urls)]
    return out


@dataclass
class LoadConfig:
    url: str                              # the first server; more_urls: the others (a fleet)
    keys: dict[str, str]
    endpoint: str = "completions"         # or "chat"
    model: str | None = None
    time_scale: float = 1.0
    seed: int = 0
    timeout_s: float = 600.0
    max_connections: int = 1024
    ignore_eos: bool = True
    more_urls: tuple[str, ...] = ()


@dataclass
class LoadResult:
    records: list[dict]
    timeline: dict
    wall_s: float
    model: str | None


def key_for(keys: dict[str, str], tenant: str) -> str:
    k = keys.get(tenant, keys.get("*"))
    if k is None:
        raise KeyError(tenant)
    return k


def check_keys(rows: Sequence[TraceRow], keys: dict[str, str]) -> None:
    missing = sorted({r.tenant for r in rows if r.tenant not in keys}) if "*" not in keys else []
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"keys file has no key for tenant(s) {missing[:5]}{more}; add them or a '*' entry")


async def _discover_model(client: httpx.AsyncClient, url: str, key: str) -> str | None:
    try:
        r = await client.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10.0)
        if r.status_code == 200:
            data = r.json().get("data") or []
            if data:
                return data[0].get("id")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


async def replay(rows: Sequence[TraceRow], cfg: LoadConfig, contract: Contract) -> LoadResult:
    url = base_url(cfg.url)
    url_of = spread_over([url, *(base_url(u) for u in cfg.more_urls)], rows)
    check_keys(rows, cfg.keys)
    chat = cfg.endpoint == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    limits = httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=min(256, cfg.max_connections))
    stamps_of: dict[str, list[float]] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout_s, connect=10.0), limits=limits) as client:
        model = cfg.model
        if model is None and rows:
            model = await _discover_model(client, url, key_for(cfg.keys, rows[0].tenant))
        t0 = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - t0

        async def one(row: TraceRow) -> dict:
            due = row.arrival_s * cfg.time_scale
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
            body, headers = request_of(row, cfg, model, chat, key_for(cfg.keys, row.tenant))
            sent = now()
            got = await stream_once(client, url_of[row.request_id] + path, body, headers, chat, now, cfg.timeout_s)
            stamps_of[row.request_id] = got.stamps
            return load_record(row, contract, got, sent=sent, due=due, end=now(), chat=chat,
                               url=url_of[row.request_id])

        records = await asyncio.gather(*(one(r) for r in rows))
        wall = now()
    return LoadResult(list(records), build_timeline(list(records), stamps_of, contract), wall, model)


def run_load(rows: Sequence[TraceRow], cfg: LoadConfig, contract: Contract, out: str | Path | None = None,
             workload_name: str = "workload") -> tuple[list[dict], dict, dict]:
    """Replay ``rows``; returns (records, summary, timeline) and writes them under ``out``."""
    from ..evaluation.metrics import summarize
    from ..runtime.output import write_run

    res = asyncio.run(replay(rows, cfg, contract))
    summary = summarize(res.records, res.timeline, contract)
    lags = [r["send_lag_s"] for r in res.records]
    summary.update({
        "mode": "load", "policy": "remote", "profile": "remote", "url": base_url(cfg.url),
        "urls": [base_url(u) for u in (cfg.url, *cfg.more_urls)],
        "endpoint": cfg.endpoint, "model": res.model, "workload": workload_name, **contract.identity(),
        "time_scale": cfg.time_scale, "seed": cfg.seed, "wall_s": res.wall_s,
        "client_send_lag_s": {"p50": float(np.percentile(lags, 50)) if lags else None,
                              "max": max(lags) if lags else None},
    })
    if out is not None:
        write_run(out, res.records, summary, res.timeline)
    return res.records, summary, res.timeline
