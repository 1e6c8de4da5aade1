"""``serve``: one request's fault stays with that request (engine faults, bad parameters),
and the long-lived engine keeps no per-step history."""

from __future__ import annotations

import httpx

TIMEOUT = httpx.Timeout(30.0)


def test_serve_engine_keeps_no_step_log(serve_stack, h):
    svc, st = serve_stack
    steps0 = svc.engine.num_steps
    r = httpx.post(st.url + "/v1/completions", headers=h.auth("a"), timeout=TIMEOUT,
                   json={"prompt": "the quick brown fox", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert svc.engine.num_steps >= steps0 + 5
    assert svc.engine.keep_step_log is False and svc.engine.step_log == []
