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
import json
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx
import numpy as np
import yaml

from ..contracts.contract import Contract
from ..workloads.workload import TraceRow

WORDS = ("the be to of and a in that have it for not on with he as you do at this but his by from they we say "
         "her she or an will my one all would there their what so up out if about who get which go me when "
         "make can like time no just him know take people into year your good some could them see other than "
         "then now look only come its over think also back after use two how our work first well way even new "
         "want because any these give day most us").split()


def synth_prompt(n_tokens: int, request_id: str, seed: int = 0) -> str:
    rng = np.random.default_rng([seed, zlib.crc32(request_id.encode())])
    idx = rng.integers(0, len(WORDS), size=max(1, n_tokens))
    return " ".join(WORDS[i] for i in idx)


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


REJECT_HTTP = {400, 403, 404, 413, 429, 503}


def reason_of(code: str, message: str) -> str:
    """``code: message``, the code once: a server's message often starts with its code
    (``overloaded: ...``) or carries it after a prefix (``request failed: shutdown: ...``)."""
    message = str(message or "").strip()
    at = message.find(f"{code}:")
    if at >= 0:
        return message[at:]
    return f"{code}: {message}".strip() if message else code


def _status_for(http: int, code: str | None) -> str:
    if code and code.startswith("deadline"):
        return "expired"
    if http == 504:
        return "expired"
    if http in REJECT_HTTP:
        return "rejected"
    return "failed"


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
            prompt = synth_prompt(row.prompt_tokens, row.request_id, cfg.seed)
            body: dict = {"max_tokens": row.output_tokens, "stream": True, "stream_options": {"include_usage": True}}
            if cfg.ignore_eos:
                body["ignore_eos"] = True
            if model:
                body["model"] = model
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            headers = {"authorization": f"Bearer {key_for(cfg.keys, row.tenant)}"}
            if row.klass:
                headers["x-tokenfair-class"] = row.klass
            if row.deadline_s is not None:
                headers["x-tokenfair-deadline-s"] = repr(row.deadline_s)
            if row.priority is not None:
                headers["x-tokenfair-priority"] = repr(row.priority)
            sent = now()
            stamps: list[float] = []
            usage = None
            http, code, message = 0, None, ""
            stream_error = None
            try:
                async with client.stream("POST", url_of[row.request_id] + path, json=body, headers=headers) as resp:
                    http = resp.status_code
                    if http != 200:
                        raw = await resp.aread()
                        try:
                            err = json.loads(raw).get("error") or {}
                            code, message = err.get("code"), err.get("message", "")
                        except (ValueError, AttributeError):
                            message = raw[:200].decode(errors="replace")
                    else:
                        async for line in resp.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                break
                            try:
                                chunk = json.loads(data)
                            except ValueError:
                                continue
                            if "error" in chunk:
                                err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                                stream_error = err
                                break
                            if chunk.get("usage"):
                                usage = chunk["usage"]
                            for c in chunk.get("choices") or []:
                                text = (c.get("delta") or {}).get("content") if chat else c.get("text")
                                if text:
                                    stamps.append(now())
            except httpx.TimeoutException as err:
                http, code, message = 0, "timeout", f"{type(err).__name__} after {cfg.timeout_s}s"
            except httpx.HTTPError as err:
                http, code, message = 0, "connection_error", f"{type(err).__name__}: {err}"
            end = now()
            if http == 200 and stream_error is None:
                status, reason = "finished", "completed"
            elif stream_error is not None:
                code = stream_error.get("code") or "stream_error"
                status, reason = _status_for(504 if str(code).startswith("deadline") else 0, code), \
                    reason_of(code, stream_error.get("message", ""))
            else:
                status, reason = _status_for(http, code), reason_of(code or f"http_{http}", message)
            n_out = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") is not None else len(stamps)
            prompt_tokens = int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") else row.prompt_tokens
            first = stamps[0] if stamps else None
            if first is None and n_out > 0 and status == "finished":
                first = end
            klass = contract.class_for(row.tenant, row.klass) or row.klass or contract.default_class
            spec = contract.classes.get(klass)
            rel_deadline = row.deadline_s
            if spec is not None and spec.deadline_s is not None:
                rel_deadline = max(spec.deadline_s, row.deadline_s or 0.0)
            stamps_of[row.request_id] = stamps
            return {
                "request_id": row.request_id, "tenant": row.tenant, "class": klass, "arrival_s": sent,
                "scheduled_s": first, "first_token_s": first, "finish_s": end,
                "prompt_tokens": prompt_tokens, "output_tokens": n_out if status == "finished" else len(stamps),
                "status": status, "reason": reason, "preemptions": 0,
                "deadline_s": None if rel_deadline is None else sent + rel_deadline,
                "recomputed_tokens": 0, "swapped_bytes": 0, "predicted_output_tokens": None,
                "max_wait_s": spec.max_wait_s if spec else None,
                "ttft_slo_s": spec.ttft_slo_s if spec else None, "tpot_slo_s": spec.tpot_slo_s if spec else None,
                "mode": "load", "endpoint": "chat" if chat else "completion", "http_status": http,
                "trace_prompt_tokens": row.prompt_tokens, "trace_output_tokens": row.output_tokens,
                "send_lag_s": max(0.0, sent - due), "url": url_of[row.request_id],
            }

        records = await asyncio.gather(*(one(r) for r in rows))
        wall = now()
    return LoadResult(list(records), build_timeline(list(records), stamps_of, contract), wall, model)


def build_timeline(records: list[dict], stamps_of: dict[str, list[float]], contract: Contract,
                   bucket_s: float = 1.0) -> dict:
    """Recorder.to_json()-shaped timeline from client-side token times (1 s buckets): the
    prompt's cost at the first token, one decode cost per streamed text chunk at its
    arrival, and output tokens beyond the chunk count (``usage``) at the finish."""
    wp, wd = contract.costs.prefill_token, contract.costs.decode_token
    ts: dict = defaultdict(lambda: defaultdict(float))
    cs: dict = defaultdict(lambda: defaultdict(float))
    tokens: dict = defaultdict(int)
    running: dict = defaultdict(int)
    for r in records:
        if r["first_token_s"] is None:
            continue
        b0 = int(r["first_token_s"] // bucket_s)
        ts[r["tenant"]][b0] += wp * r["prompt_tokens"]
        cs[r["class"]][b0] += wp * r["prompt_tokens"]
        tokens[b0] += r["prompt_tokens"]
        stamps = list(stamps_of.get(r["request_id"], ()))[: r["output_tokens"]]
        stamps += [r["finish_s"]] * (r["output_tokens"] - len(stamps))
        for t in stamps:
            b = int(t // bucket_s)
            ts[r["tenant"]][b] += wd
            cs[r["class"]][b] += wd
            tokens[b] += 1
        t1 = r["finish_s"]
        for b in range(int(r["arrival_s"] // bucket_s), int(t1 // bucket_s) + 1):
            running[b] += 1
    span = max((r["finish_s"] for r in records if r["finish_s"] is not None), default=0.0)
    return {
        "bucket_s": bucket_s,
        "tenant_service": {t: dict(sorted(v.items())) for t, v in ts.items()},
        "class_service": {c: dict(sorted(v.items())) for c, v in cs.items()},
        "tokens": dict(sorted(tokens.items())),
        "queue_len": {}, "running": dict(sorted(running.items())), "kv_usage": {}, "preemptions": [],
        "num_steps": 0, "busy_s": span, "swap_s": 0.0,
    }


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
