"""Reason codes (``core/reasons.py``): every reason the core emits is a typed ``Reason`` whose
code is a member of the closed set; its text is ``"code: detail"`` as records show it; the
HTTP status, the metric label and the outcome counts come from the code; a stored text with
no reason or a foreign code reads as a defined fallback; the docs list exactly the set."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile, load_profile
from tokenfair.core.reasons import (BY_VALUE, FALLBACK_CODES, Reason, ReasonCode, backend_finished, code_of,
                                    from_upstream)
from tokenfair.core.request import Request, Status
from tokenfair.evaluation.goodput import outcomes
from tokenfair.evaluation.metrics import request_record
from tokenfair.sim.simulate import simulate_once
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.workloads.workload import TraceRow, Workload

ROOT = Path(__file__).resolve().parents[1]

# a contract and workload that make the core emit each of its admission / expiry / finish codes
CONTRACT = {
    "classes": {"interactive": {"priority": 10, "max_wait_s": 20},
                "deadline": {"priority": 20, "deadline_s": 0.05},
                "batch": {"priority": 0}},
    "tenants": {"a": {"max_queued": 3, "classes": ["batch"]},
                "b": {"classes": ["batch"]},
                "c": {"max_queued": 100_000, "classes": ["interactive", "deadline"]}},
}


def _rows() -> tuple[TraceRow, ...]:
    rows = [TraceRow("too-big", 0.0, "a", 50_000, 5, klass="batch"),            # over the KV pool
            TraceRow("not-allowed", 0.0, "b", 10, 5, klass="interactive"),      # b may not use it
            TraceRow("capped", 0.0, "a", 10, 50, klass="batch", max_tokens=8)]  # stops at max_tokens
    rows += [TraceRow(f"flood{i}", 0.001 * i, "a", 2000, 200, klass="batch") for i in range(12)]   # queue_full
    rows += [TraceRow(f"late{i}", 0.02 + 0.001 * i, "c", 2000, 50, klass="deadline") for i in range(4)]
    # a flood far beyond capacity: once the forecast is warm (10 s), arrivals are shed
    rows += [TraceRow(f"shed{i}", 0.03 + 0.02 * i, "c", 4000, 400, klass="interactive") for i in range(3000)]
    return tuple(sorted(rows, key=lambda r: r.arrival_s))


def _ended(reqs: list[Request]) -> dict[ReasonCode, int]:
    seen: dict[ReasonCode, int] = {}
    for r in reqs:
        assert r.status.is_terminal
        assert isinstance(r.end_reason, Reason), (r.request_id, r.end_reason)
        code = r.reason_code
        assert isinstance(code, ReasonCode) and code not in FALLBACK_CODES, (r.request_id, r.reason)
        assert code_of(request_record(r)["reason"]) is code        # the stored text parses back to it
        seen[code] = seen.get(code, 0) + 1
    return seen


def test_the_core_emits_only_enum_members_and_each_parses_back():
    profile = Profile(name="small", kv_capacity_tokens=40_000)
    res = simulate_once(Workload("reasons", _rows()), "fair", parse_contract(CONTRACT), profile)
    seen = _ended(res.requests)
    by_id = {r.request_id: r for r in res.requests}
    assert by_id["too-big"].reason_code is ReasonCode.PROMPT_EXCEEDS_KV_CAPACITY
    assert by_id["not-allowed"].reason_code is ReasonCode.CLASS_NOT_ALLOWED
    assert by_id["capped"].reason == "max_tokens" and by_id["capped"].status is Status.FINISHED
    for code in (ReasonCode.QUEUE_FULL, ReasonCode.DEADLINE_INFEASIBLE, ReasonCode.OVERLOADED,
                 ReasonCode.EOS_OR_LENGTH):
        assert seen.get(code, 0) > 0, (code, seen)
    assert by_id["too-big"].reason == "prompt_exceeds_kv_capacity: 50000 tokens > 40000"


@pytest.mark.parametrize("policy", ["fifo", "vtc", "fair"])
def test_every_scenario_end_is_a_member(policy):
    for name in ("flood", "burst"):
        wl, c = build_scenario(name, 0)
        _ended(simulate_once(wl, policy, c, load_profile(None)).requests)


def test_reason_text_is_code_colon_detail_and_frozen():
    assert Reason(ReasonCode.QUEUE_FULL, "tenant 'a' has 3 queued").text == "queue_full: tenant 'a' has 3 queued"
    assert str(Reason(ReasonCode.MAX_TOKENS)) == Reason(ReasonCode.MAX_TOKENS).text == "max_tokens"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Reason(ReasonCode.SHUTDOWN).code = ReasonCode.QUEUE_FULL        # type: ignore[misc]
    req = Request("r", 0, "t", "default", 0.0, 10, 5)
    assert (req.reason, req.reason_code) == ("", None)
    with pytest.raises(AttributeError):
        req.reason = "queue_full: by hand"          # type: ignore[misc]  # text is read from the typed value
    req.end_reason = Reason(ReasonCode.OVERLOADED, "x")
    assert (req.reason, req.reason_code) == ("overloaded: x", ReasonCode.OVERLOADED)


def test_a_stored_text_parses_to_a_member_or_a_defined_fallback():
    for code in ReasonCode:
        if code not in FALLBACK_CODES:
            assert code_of(Reason(code, "some: detail").text) is code
            assert code_of(code.value) is code
    assert code_of(None) is code_of("") is ReasonCode.UNSPECIFIED
    assert code_of("http_502: bad gateway") is code_of("Weird Reason!") is ReasonCode.OTHER
    recs = [{"status": "failed", "reason": t} for t in ("http_502: x", "", "engine_error: boom")]
    assert outcomes(recs) == {"failed": {"engine_error": 1, "other": 1, "unspecified": 1}}
    assert len(BY_VALUE) == len(ReasonCode)                              # values are unique


def test_a_backends_code_is_kept_when_it_is_ours():
    assert from_upstream("queue_full", ReasonCode.BACKEND_STATUS, "backend 1 answered 429: q").text == \
        "queue_full: backend 1 answered 429: q"
    foreign = from_upstream("BadRequestError", ReasonCode.BACKEND_STATUS, "backend 1 answered 400: no")
    assert foreign.code is ReasonCode.BACKEND_STATUS and foreign.text == \
        "backend_status: BadRequestError: backend 1 answered 400: no"
    assert from_upstream(None, ReasonCode.BACKEND_ERROR, "backend 1: gone").text == "backend_error: backend 1: gone"
    assert from_upstream("other", ReasonCode.BACKEND_ERROR, "d").code is ReasonCode.BACKEND_ERROR
    assert backend_finished("stop").text == "backend_stop" and backend_finished("length").code is ReasonCode.BACKEND_LENGTH
    assert backend_finished("eos").text == "backend_finished: eos"


def test_http_status_and_metric_labels_come_from_the_code():
    pytest.importorskip("fastapi")
    from tokenfair.serve.errors import FAIL_STATUS, NO_RETRY_CODES, REJECT_STATUS, can_retry, http_status_of
    from tokenfair.serve.metrics import ServiceMetrics

    assert all(isinstance(c, ReasonCode) for c in (*REJECT_STATUS, *FAIL_STATUS, *NO_RETRY_CODES))

    def ended(status: Status, reason: Reason) -> Request:
        req = Request("r", 0, "a", "default", 0.0, 10, 5)
        req.status, req.end_reason = status, reason
        return req

    # the detail never decides: a detail that reads like another code changes nothing
    assert http_status_of(ended(Status.REJECTED, Reason(ReasonCode.CLASS_NOT_ALLOWED, "queue_full: no"))) == 403
    assert http_status_of(ended(Status.REJECTED, Reason(ReasonCode.PROMPT_EXCEEDS_KV_CAPACITY, "x"))) == 413
    assert http_status_of(ended(Status.FAILED, Reason(ReasonCode.CLIENT_DISCONNECTED, "x"))) == 499
    assert http_status_of(ended(Status.FAILED, Reason(ReasonCode.ENGINE_ERROR, "shutdown: x"))) == 500
    assert http_status_of(ended(Status.EXPIRED, Reason(ReasonCode.DEADLINE_INFEASIBLE, "x"))) == 504
    # shed from the queue (sched/fair/review.py): throttled as at the door, with its retry hint
    from tokenfair.serve.jobs import failed_event
    shed = ended(Status.EXPIRED, Reason(ReasonCode.OVERLOADED, "queued 240s: predicted wait 75.2s more exceeds "
                                        "60.0s (class 'batch' max_wait_s 300.0); retry after ~15s"))
    assert http_status_of(shed) == 429
    event = failed_event(shed)
    assert event.status == 429 and event.headers == {"retry-after": "15"} and event.code is ReasonCode.OVERLOADED
    assert not can_retry(400, ReasonCode.CONTEXT_LENGTH_EXCEEDED) and not can_retry(500, "request_fault")
    assert can_retry(429, ReasonCode.QUEUE_FULL)

    m = ServiceMetrics(parse_contract({"tenants": {"a": {}}}))
    m.rejected("a", ReasonCode.OVERLOADED)
    m.rejected("a", None)
    labels = set(re.findall(r'^tokenfair_rejections_total\{reason="([^"]+)",tenant="a"\}',
                            m.render().decode(), re.M))
    assert labels == {"overloaded", "unspecified"} and labels <= set(BY_VALUE)


def test_the_docs_table_lists_exactly_the_codes():
    text = (ROOT / "docs" / "SERVICE.md").read_text()
    table = text.split("### Reason codes", 1)[1].split("\n\n", 3)[2]
    documented = set(re.findall(r"`([a-z_]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()
                                                         if line.startswith("| `"))))
    assert documented == set(BY_VALUE)
