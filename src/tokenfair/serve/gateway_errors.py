"""A backend's error as the gateway passes it on: the backend's status, ``code`` and
``param`` kept (``context_length_exceeded`` stays ``context_length_exceeded``), whether a
retry on another backend can help, and the backends' addresses removed from what the
client reads (``backend 2`` instead of ``10.0.0.7:8000``).

A retry cannot help when the backend says so (``x-should-retry: false``), when its code is
one of :data:`tokenfair.serve.errors.NO_RETRY_CODES`, or for a 4xx other than 408/409/429.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import can_retry

MAX_MESSAGE_CHARS = 500


@dataclass(frozen=True)
class BackendError:
    status: int                 # the backend's HTTP status (0: an error event inside a stream)
    message: str                # the backend's message, or the start of its body
    code: str | None            # the backend's error code, if it gave one
    param: str | None           # the backend's error param, if it gave one
    retry: bool                 # whether another try (on any backend) may succeed


def parse_backend_error(status: int, raw: bytes | dict | None, should_retry: str | None = None) -> BackendError:
    """The error of a non-200 answer (``raw``: its body) or of an error event (a dict)."""
    err: object = None
    if isinstance(raw, dict):
        err = raw
    elif raw:
        try:
            err = json.loads(raw).get("error")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
            err = None
    if isinstance(err, dict):
        message = str(err.get("message") or "error")
        code = err.get("code") if isinstance(err.get("code"), str) else None
        param = err.get("param") if isinstance(err.get("param"), str) else None
    else:
        message = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(err or "error")) or "error"
        code = param = None
    retry = can_retry(status or 500, code)
    if should_retry is not None and should_retry.strip().lower() in ("false", "true"):
        retry = should_retry.strip().lower() == "true"
    return BackendError(status, message[:MAX_MESSAGE_CHARS], code, param, retry)


def scrub(text: str, backends) -> str:
    """``text`` with every backend's URL and host:port replaced by ``backend N``."""
    for i, b in enumerate(backends, 1):
        for addr in (b.url, b.url.removesuffix("/v1"), b.name):
            if addr:
                text = text.replace(addr, f"backend {i}")
    return text
