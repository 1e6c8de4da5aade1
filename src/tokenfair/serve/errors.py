"""HTTP error mapping for the service: :class:`ServiceError` (a refusal with an HTTP status,
an OpenAI error body and headers) and the terminal-state -> HTTP status tables."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ..request import Request, Status
from .metrics import reason_code
from .openai_schema import error_body

REJECT_STATUS = {"queue_full": 429, "overloaded": 429, "rate_limited": 429, "class_not_allowed": 403,
                 "context_length_exceeded": 413, "prompt_exceeds_kv_capacity": 413,
                 "shutting_down": 503, "no_backend": 503, "model_not_found": 404}
FAIL_STATUS = {"shutdown": 503, "unschedulable": 503, "no_backend": 503, "client_disconnected": 499,
               "backend_error": 502, "backend_status": 502, "backend_unavailable": 503}


class ServiceError(Exception):
    """A refusal with an HTTP status, an OpenAI error body and headers."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

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
