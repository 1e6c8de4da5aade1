"""OpenAPI of ``serve`` and ``gateway``: request bodies and error responses documented, and
schemathesis-generated requests (bounded examples) answered without a server error and
within the documented statuses and schemas.

Not checked: that every schema-valid body is accepted -- a prompt plus ``max_tokens`` beyond
the model's context is schema-valid and answered 400 ``context_length_exceeded``, as
OpenAI's API does; the context depends on the model, not on the schema."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

MAX_EXAMPLES = 12


def test_openapi_documents_bodies_and_errors(serve_stack):
    import httpx

    _, st = serve_stack
    doc = httpx.get(st.url + "/openapi.json").json()
    op = doc["paths"]["/v1/chat/completions"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert {"200", "400", "401", "413", "429", "503", "504"} <= set(op["responses"])
    assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "messages" in doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]


def _fuzz(url: str, key: str) -> list[str]:
    """Run schemathesis over every operation at ``url``; the failures it found."""
    from hypothesis import given
    from schemathesis.checks import positive_data_acceptance

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()

        @given(case=op.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            if case.body is not None and isinstance(case.body, dict):
                case.body.pop("stream", None)          # SSE bodies are checked elsewhere
                if isinstance(case.body.get("max_tokens"), int):
                    case.body["max_tokens"] = min(case.body["max_tokens"], 8)
            try:
                case.call_and_validate(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30,
                                       excluded_checks=[positive_data_acceptance])
            except AssertionError as err:
                failures.append(f"{op.label}: {str(err)[:400]}")
                raise
        try:
            run()
        except Exception:  # noqa: BLE001 - collected in failures
            pass
    return failures


def test_schemathesis_against_serve(serve_stack, h):
    _, st = serve_stack
    assert _fuzz(st.url, h.KEYS["a"]) == []


def test_schemathesis_against_gateway(serve_stack, h):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    _, st = serve_stack
    contract = h.service_contract()
    gw = Gateway(contract, KeyRing(contract), [st.url], backend_key=h.KEYS["a"])
    with ServerThread(create_app(gw), gw) as gt:
        assert _fuzz(gt.url, h.KEYS["a"]) == []
