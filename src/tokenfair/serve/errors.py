"""HTTP error mapping for the service: :class:`ServiceError` (a refusal with an HTTP status,
an OpenAI error body and headers) and the terminal-state -> HTTP status tables."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ..core.request import Request, Status
from .metrics import reason_code
from .openai_schema import error_body

REJECT_STATUS = {"queue_full": 429, "overloaded": 429, "rate_limited": 429, "class_not_allowed": 403,
                 "context_length_exceeded": 400, "prompt_exceeds_kv_capacity": 413,
                 "shutting_down": 503, "no_backend": 503, "model_not_found": 404}
FAIL_STATUS = {"shutdown": 503, "unschedulable": 503, "no_backend": 503, "client_disconnected": 499,
               "backend_error": 502, "backend_status": 502, "backend_unavailable": 503,
               "invalid_sampling": 400}

# Reason codes a retry cannot fix: the same request fails the same way on any replica.
NO_RETRY_CODES = frozenset({
    "deadline_infeasible", "context_length_exceeded", "prompt_exceeds_kv_capacity", "class_not_allowed",
    "model_not_found", "invalid_sampling", "non_finite_logits", "request_error", "request_fault",
    "client_disconnected", "invalid_request", "invalid_json", "invalid_header", "unsupported_parameter",
    "invalid_api_key", "no_tokenizer", "body_too_large",
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
    code = reason_code(req.reason)
    if req.status is Status.FINISHED:
        return 200
    if req.status is Status.EXPIRED:
        return 504
    if req.status is Status.REJECTED:
        return REJECT_STATUS.get(code, 429)
    return FAIL_STATUS.get(code, 500)
