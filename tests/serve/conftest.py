"""Fixtures for the HTTP service tests: a tiny random Llama (``tests/tiny_model.py``), a contract
with API keys, and real uvicorn servers on free loopback ports in background threads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from concurrency import wait_until
from tiny_model import make_tiny_llama

KEYS = {"a": "key-a", "b": "key-b", "q": "key-q", "r": "key-r", "heavy": "key-heavy", "light": "key-light"}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("serve_tiny_llama")
    make_tiny_llama(folder)
    return folder


def service_contract():
    from tokenfair.contracts.contract import parse_contract
    from tokenfair.serve.auth import hash_key

    classes = {
        "realtime": {"priority": 30, "aging_rate": 1.0, "max_wait_s": 10},
        "interactive": {"priority": 20, "aging_rate": 1.0, "max_wait_s": 30},
        "batch": {"priority": 0, "aging_rate": 0.5, "max_wait_s": 600},
        "timed": {"priority": 10, "aging_rate": 1.0, "max_wait_s": 30, "deadline_s": 60},
    }
    tenants = {
        "a": {"weight": 1.0},
        "b": {"weight": 1.0, "classes": ["batch", "timed"], "default_class": "batch"},
        "q": {"max_concurrency": 1, "max_queued": 1},
        "r": {"rate_limit": {"tokens_per_s": 0.5, "burst_tokens": 10}},
        "heavy": {"weight": 1.0},
        "light": {"weight": 1.0},
    }
    for name, spec in tenants.items():
        spec["api_key_sha256"] = [hash_key(KEYS[name])]
    return parse_contract({"version": "serve-test", "tenants": tenants, "classes": classes,
                           "default_class": "interactive"})


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def start_serve(model_dir: Path, contract=None, grace_s: float = 5.0, kv_tokens: int = 4096, **kw):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.engine_backend import build_engine_service
    from tokenfair.serve.shutdown import ServerThread

    contract = contract or service_contract()
    svc = build_engine_service(str(model_dir), contract, KeyRing(contract), kv_tokens=kv_tokens,
                               served_model="tiny", **kw)
    st = ServerThread(create_app(svc, grace_s), svc, grace_s=grace_s).start()
    return svc, st


@pytest.fixture(scope="session")
def serve_stack(tiny_model_dir):
    """(service, server thread) of one ``serve`` instance shared by the serve tests."""
    svc, st = start_serve(tiny_model_dir)
    yield svc, st
    st.stop()


def assert_retry_after_honoured(service, url: str, key: str, monkeypatch) -> None:
    """``service`` refuses the first request with 429 ``Retry-After: 1`` (its door check);
    the official openai client waits that second, not its own ~0.5 s backoff, and retries."""
    import httpx
    import openai

    from tokenfair.core.reasons import Reason, ReasonCode

    door = service.door_check
    refusals = [(Reason(ReasonCode.RATE_LIMITED, "tenant 'a' is over its token rate; retry after ~1s"), 1.0)]
    monkeypatch.setattr(service, "door_check", lambda req, now: refusals.pop() if refusals else door(req, now))
    sent: list[float] = []
    answers: list[tuple[int, str | None]] = []
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(time.monotonic())],
                                     "response": [lambda r: answers.append((r.status_code, r.headers.get("retry-after")))]})
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, http_client=http, max_retries=1, timeout=30.0)
    out = client.completions.create(model="tiny", prompt="fox", max_tokens=2)
    assert out.choices[0].text is not None and answers == [(429, "1"), (200, None)]
    assert 0.95 <= sent[1] - sent[0] < 3.0


class _Helpers:
    KEYS = KEYS
    assert_retry_after_honoured = staticmethod(assert_retry_after_honoured)
    auth = staticmethod(auth)
    wait_until = staticmethod(wait_until)
    start_serve = staticmethod(start_serve)
    service_contract = staticmethod(service_contract)


@pytest.fixture(scope="session")
def h():
    """Helpers (importing from a conftest is ambiguous with several test folders)."""
    return _Helpers
