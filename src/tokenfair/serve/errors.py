"""HTTP error mapping for the service: :class:`ServiceError` (a refusal with an HTTP status,
an OpenAI error body and headers) and the terminal-state -> HTTP status tables."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from ..core.reasons import ReasonCode as C
from ..core.request import Request, Status
from .openai_schema import error_body

# HTTP status of a REJECTED request by its reason code (429 for the others)
REJECT_STATUS: dict[C, int] = {
    C.QUEUE_FULL: 429, C.OVERLOADED: 429, C.RATE_LIMITED: 429, C.CLASS_NOT_ALLOWED: 403,
    C.CONTEXT_LENGTH_EXCEEDED: 400, C.PROMPT_EXCEEDS_KV_CAPACITY: 413, C.SHUTTING_DOWN: 503,
    C.NO_BACKEND: 503, C.MODEL_NOT_FOUND: 404}
# HTTP status of a FAILED request by its reason code (500 for the others)
FAIL_STATUS: dict[C, int] = {
    C.SHUTDOWN: 503, C.UNSCHEDULABLE: 503, C.NO_BACKEND: 503, C.CLIENT_DISCONNECTED: 499,
    C.BACKEND_ERROR: 502, C.BACKEND_STATUS: 502, C.BACKEND_UNAVAILABLE: 503, C.INVALID_SAMPLING: 400}

# Reason codes a retry cannot fix: the same request fails the same way on any replica.
NO_RETRY_CODES: frozenset[C] = frozenset({
    C.DEADLINE_INFEASIBLE, C.CONTEXT_LENGTH_EXCEEDED, C.PROMPT_EXCEEDS_KV_CAPACITY, C.CLASS_NOT_ALLOWED,
    C.MODEL_NOT_FOUND, C.INVALID_SAMPLING, C.NON_FINITE_LOGITS, C.REQUEST_ERROR, C.REQUEST_FAULT,
    C.CLIENT_DISCONNECTED, C.INVALID_REQUEST, C.INVALID_JSON, C.INVALID_HEADER, C.UNSUPPORTED_PARAMETER,
    C.INVALID_API_KEY, C.NO_TOKENIZER, C.BODY_TOO_LARGE,
})
RETRYABLE_4XX = (408, 409, 429)


def can_retry(status: int, code: str | None) -> bool:
    """Whether sending the same request again may succeed (OpenAI clients read the answer
    from the ``x-should-retry`` header): throttling and server-side trouble, unless the
    code says the request itself is at fault."""
    if code in NO_RETRY_CODES:
        return False
    return status in RETRYABLE_4XX or status >= 500


def retry_header(status: int, code: str | None) -> dict[str, str]:
    """``{"x-should-retry": "false"}`` for an error a retry cannot fix, else nothing."""
    return {} if can_retry(status, code) else {"x-should-retry": "false"}


class ServiceError(Exception):
    """A refusal with an HTTP status, an OpenAI error body and headers."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = {**retry_header(status, code), **(headers or {})}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.code, self.param),
                            status_code=self.status, headers=self.headers)


def http_status_of(req: Request) -> int:
    """The HTTP status a terminal request maps to (200 for a finished one)."""
    code = req.reason_code
    if req.status is Status.FINISHED:
        return 200
    if req.status is Status.EXPIRED:               # shed from the queue: throttled, as at the door
        return 429 if code is C.OVERLOADED else 504
    if req.status is Status.REJECTED:
        return REJECT_STATUS.get(code, 429)
    return FAIL_STATUS.get(code, 500)


def retry_hint_s(reason: str) -> float:
    """The ``retry after ~Ns`` a reason gives (1 s when it gives none)."""
    m = re.search(r"retry after ~?([0-9.]+)s", reason)
    return float(m.group(1)) if m else 1.0
