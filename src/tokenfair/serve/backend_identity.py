"""Who the backend is told the request belongs to: the authenticated tenant, its class and
the class's priority, written into the body a backend receives.

vLLM's OpenAI server passes ``vllm_xargs`` (a flat object of strings and numbers) to the
engine as ``SamplingParams.extra_args``, where a scheduler plugin reads it
(``tokenfair.integrations.vllm``); ``user`` and custom headers do not reach the engine.  The
gateway therefore sets ``vllm_xargs.tenant`` and ``vllm_xargs.class`` from the tenant it
authenticated and the class the contract resolved, replacing whatever the client sent there
(a client cannot claim another tenant), and keeps the client's other ``vllm_xargs`` keys.

``priority``: vLLM orders its ``priority`` scheduling policy by the request's ``priority``
field, *lower first*; tokenfair's class priorities are *higher first*.  The gateway sends
``-round(class priority)``.  Stock vLLM with the default ``fcfs`` policy refuses a nonzero
priority (HTTP 400), so it is sent only when the gateway is told the backends run the
``priority`` policy or the tokenfair scheduler (``backend_priority=True``); otherwise any
client-sent ``priority`` is removed (a client cannot jump a priority queue either).
"""

from __future__ import annotations

TENANT_KEY = "tenant"
CLASS_KEY = "class"


def vllm_priority(class_priority: float) -> int:
    """vLLM's priority (lower is served first) for a tokenfair class priority (higher first)."""
    return -int(round(class_priority))


def tag_body(body: dict, tenant: str, klass: str, class_priority: float, *, backend_priority: bool) -> dict:
    """``body`` (a fresh dict the caller owns) with the identity fields set in place."""
    xargs = body.get("vllm_xargs")
    merged = dict(xargs) if isinstance(xargs, dict) else {}
    merged[TENANT_KEY] = tenant
    merged[CLASS_KEY] = klass
    body["vllm_xargs"] = merged
    if backend_priority:
        body["priority"] = vllm_priority(class_priority)
    else:
        body.pop("priority", None)
    return body
