"""One request of ``tokenfair load``: its body and headers from a trace row, the streamed
response read chunk by chunk (token arrival times, usage, an error in the stream), and the
record it leaves (the simulator's fields; :mod:`.load` describes the rules)."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Callable

import httpx
import numpy as np

from ..contracts.contract import Contract
from ..core.reasons import ReasonCode
from ..workloads.workload import TraceRow
from .sse_read import data_chunks

WORDS = ("the be to of and a in that have it for not on with he as you do at this but his by from they we say "
         "her she or an will my one all would there their what so up out if about who get which go me when "
         "make can like time no just him know take people into year your good some could them see other than "
         "then now look only come its over think also back after use two how our work first well way even new "
         "want because any these give day most us").split()


def synth_prompt(n_tokens: int, request_id: str, seed: int = 0) -> str:
    rng = np.random.default_rng([seed, zlib.crc32(request_id.encode())])
    idx = rng.integers(0, len(WORDS), size=max(1, n_tokens))
    return " ".join(WORDS[i] for i in idx)


REJECT_HTTP = {400, 403, 404, 413, 429, 503}


def reason_of(code: str, message: str) -> str:
    """``code: message``, the code once: a server's message often starts with its code
    (``overloaded: ...``) or carries it after a prefix (``request failed: shutdown: ...``)."""
    message = str(message or "").strip()
    at = message.find(f"{code}:")
    if at >= 0:
        return message[at:]
    return f"{code}: {message}".strip() if message else code


def status_for(http: int, code: str | None) -> str:
    if code and code.startswith("deadline"):
        return "expired"
    if http == 504:
        return "expired"
    if http in REJECT_HTTP:
        return "rejected"
    return "failed"



def request_of(row: TraceRow, cfg, model: str | None, chat: bool, key: str) -> tuple[dict, dict]:
    """(JSON body, headers) of ``row``'s streaming request (``cfg``: a ``LoadConfig``)."""
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
    headers = {"authorization": f"Bearer {key}"}
    if row.klass:
        headers["x-tokenfair-class"] = row.klass
    if row.deadline_s is not None:
        headers["x-tokenfair-deadline-s"] = repr(row.deadline_s)
    if row.priority is not None:
        headers["x-tokenfair-priority"] = repr(row.priority)
    return body, headers


@dataclass
class Streamed:
    """What one request got back.  ``http`` 0: no response (timeout, connection error)."""
    http: int = 0
    code: str | None = None
    message: str = ""
    stream_error: dict | None = None        # an error chunk inside a 200 stream
    usage: dict | None = None
    stamps: list[float] = field(default_factory=list)   # arrival time of each text chunk


async def stream_once(client: httpx.AsyncClient, url: str, body: dict, headers: dict, chat: bool,
                      now: Callable[[], float], timeout_s: float) -> Streamed:
    got = Streamed()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            got.http = resp.status_code
            if got.http != 200:
                raw = await resp.aread()
                try:
                    err = json.loads(raw).get("error") or {}
                    got.code, got.message = err.get("code"), err.get("message", "")
                except (ValueError, AttributeError):
                    got.message = raw[:200].decode(errors="replace")
            else:
                await _read_stream(resp, got, chat, now)
    except httpx.TimeoutException as err:
        got.http, got.code, got.message = 0, "timeout", f"{type(err).__name__} after {timeout_s}s"
    except httpx.HTTPError as err:
        got.http, got.code, got.message = 0, "connection_error", f"{type(err).__name__}: {err}"
    return got


async def _read_stream(resp, got: Streamed, chat: bool, now: Callable[[], float]) -> None:
    async for chunk in data_chunks(resp.aiter_lines()):
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            got.stream_error = err
            break
        if chunk.get("usage"):
            got.usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            text = (c.get("delta") or {}).get("content") if chat else c.get("text")
            if text:
                got.stamps.append(now())


def load_record(row: TraceRow, contract: Contract, got: Streamed, *, sent: float, due: float, end: float,
                chat: bool, url: str) -> dict:
    """The request's record: status and reason from the response, times since the start."""
    http, code, stamps, usage = got.http, got.code, got.stamps, got.usage
    if http == 200 and got.stream_error is None:
        status, reason = "finished", ReasonCode.COMPLETED.value
    elif got.stream_error is not None:
        code = got.stream_error.get("code") or "stream_error"
        status, reason = status_for(504 if str(code).startswith("deadline") else 0, code), \
            reason_of(code, got.stream_error.get("message", ""))
    else:
        status, reason = status_for(http, code), reason_of(code or f"http_{http}", got.message)
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
        "send_lag_s": max(0.0, sent - due), "url": url,
    }
