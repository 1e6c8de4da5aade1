"""Gateway health: a backend that stops answering (SIGSTOP) is marked down within seconds and
drained (its requests re-queued on the other backend or failed with a reason); timeouts;
probes with the gateway's key (a 401 to it is not 'up'); models listed from the start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

FAKE = ("import sys, uvicorn; from tokenfair.serve.fake_backend import create_fake_backend; "
        "uvicorn.run(create_fake_backend(concurrency=16, token_delay_s=0.05), host='127.0.0.1', "
        "port=int(sys.argv[1]), log_level='warning')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def stoppable_backend():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", FAKE, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield proc, url
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(10)


def _gateway(h, backends, **kw):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), backends, **kw)
    return gw, ServerThread(create_app(gw), gw)


def test_sigstopped_backend_is_detected_and_drained(h, stoppable_backend):
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway_health import HealthConfig
    from tokenfair.serve.shutdown import ServerThread

    proc, url = stoppable_backend
    health = HealthConfig(probe_interval_s=0.3, probe_timeout_s=0.5, probe_failures_down=2)
    with ServerThread(create_fake_backend(concurrency=16, token_delay_s=0.05)) as other:
        gw, gst = _gateway(h, [url, other.url], health=health)
        with gst:
            results = []

            def call(i):
                r = httpx.post(gst.url + "/v1/completions", headers=h.auth("a" if i % 2 else "heavy"), timeout=60,
                               json={"prompt": "a b c", "max_tokens": 40, "stream": i % 2 == 0})
                results.append((r.status_code, r.text))
            threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            assert h.wait_until(lambda: gw.backends[0].inflight > 0, 10)
            os.kill(proc.pid, signal.SIGSTOP)
            t_stop = time.monotonic()
            assert h.wait_until(lambda: not gw.backends[0].up, 10)
            detected_s = time.monotonic() - t_stop
            health_body = httpx.get(gst.url + "/healthz").json()
            for t in threads:
                t.join(60)
            assert gw.backends[0].inflight == 0 and not gw.jobs
    assert detected_s < 3.0, detected_s          # 2 x (0.3 + 0.5) s with this configuration
    assert health_body["backends_down"] == [gw.backends[0].name]
    recs = list(gw.records.items)
    assert len(recs) == 8
    for rec in recs:       # finished (re-queued or on the live backend) or failed with the reason
        assert rec["status"] == "finished" or rec["reason"].startswith("backend_unavailable:"), rec
    assert any(r["preemptions"] for r in recs) or any(r["status"] == "failed" for r in recs)


def test_first_token_timeout_fails_with_a_reason(h):
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway_health import HealthConfig
    from tokenfair.serve.shutdown import ServerThread

    with ServerThread(create_fake_backend(ttft_s=3.0)) as be:
        gw, gst = _gateway(h, [be.url], health=HealthConfig(first_token_timeout_s=0.3), max_retries=0)
        with gst:
            t0 = time.monotonic()
            r = httpx.post(gst.url + "/v1/completions", headers=h.auth("a"), timeout=30,
                           json={"prompt": "x", "max_tokens": 2})
            took = time.monotonic() - t0
    assert r.status_code == 502, r.text
    assert "no first token within 0.3 s" in r.json()["error"]["message"]
    assert took < 2.5 and be.url.split("://")[1] not in r.text


def test_models_listed_from_the_start_and_a_401_to_the_backend_key_is_down(h, tiny_model_dir):
    import openai

    svc, st = h.start_serve(tiny_model_dir)
    try:
        gw, gst = _gateway(h, [st.url], backend_key=h.KEYS["a"])
        with gst:
            client = openai.OpenAI(base_url=gst.url + "/v1", api_key=h.KEYS["b"], max_retries=0)
            assert [m.id for m in client.models.list()] == ["tiny"]
        gw2, gst2 = _gateway(h, [st.url])           # no backend key: asked with the client's key
        with gst2:
            client = openai.OpenAI(base_url=gst2.url + "/v1", api_key=h.KEYS["b"], max_retries=0)
            assert [m.id for m in client.models.list()] == ["tiny"]
        gw3, gst3 = _gateway(h, [st.url], backend_key="wrong-key")
        with gst3:
            health = httpx.get(gst3.url + "/healthz")
            assert health.status_code == 503 and health.json()["backends_down"]
            assert "rejects the gateway's --backend-key 401" in gw3.prober.states[gw3.backends[0].url].reason
    finally:
        st.stop()


@pytest.mark.parametrize("args,needle", [(["--probe-timeout-s", "0"], "--probe-timeout-s: input should be greater than 0"),
                                         (["--first-token-timeout-s", "-1"], "--first-token-timeout-s"),
                                         (["--max-body-bytes", "0"], "--max-body-bytes must be > 0"),
                                         (["--max-prefill-backlog", "-1"], "--max-prefill-backlog: expected tokens >= 0"),
                                         (["--port", "70000"], "Invalid value for '--port'"),
                                         (["--ttft-tolerance", "-1"], "Invalid value for '--ttft-tolerance'"),
                                         (["--max-inflight-tokens", "-5"], "Invalid value for '--max-inflight-tokens'"),
                                         (["--max-context", "0"], "Invalid value for '--max-context'"),
                                         (["--grace-s", "nan"], "Invalid value for '--grace-s'"),
                                         (["--max-tenant-labels", "-1"], "Invalid value for '--max-tenant-labels'")])
def test_gateway_timeout_options_are_checked(args, needle):
    from typer.testing import CliRunner

    from tokenfair.cli.app import app

    res = CliRunner().invoke(app, ["gateway", "--backend", "http://127.0.0.1:9", "--allow-anonymous", "t", *args])
    assert res.exit_code == 2 and needle in res.output, res.output
