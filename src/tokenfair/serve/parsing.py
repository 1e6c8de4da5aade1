"""Request parsing for the HTTP layer: ``x-tokenfair-*`` headers and the body's extension
into a :class:`GenRequest`, and pydantic validation errors into one 400 message."""

from __future__ import annotations

import json
import math
import re
import uuid

from ..core.reasons import ReasonCode
from .errors import ServiceError
from .jobs import GenRequest
from .limits import refuse_unsupported


def parse_body(raw_bytes: bytes, model_cls):
    """(validated body, raw dict) of a JSON request body; a ServiceError 400 naming the field
    otherwise (strict types: ``"stream": "yes"`` or ``"max_tokens": "2"`` are refused)."""
    try:
        raw = json.loads(raw_bytes or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ServiceError(400, "body is not valid JSON", ReasonCode.INVALID_JSON) from None
    if not isinstance(raw, dict):
        raise ServiceError(400, "body must be a JSON object", ReasonCode.INVALID_REQUEST)
    refuse_unsupported(raw)
    try:
        body = model_cls.model_validate(raw)
    except Exception as err:  # pydantic.ValidationError (or a validator's own error)
        errors = getattr(err, "errors", None)
        if errors is None:
            raise ServiceError(400, f"invalid request: {err}", ReasonCode.INVALID_REQUEST) from None
        msg, param = validation_message(err.errors())
        raise ServiceError(400, msg, ReasonCode.INVALID_REQUEST, param) from None
    return body, raw


def _header_float(headers, name: str) -> float | None:
    raw = headers.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ServiceError(400, f"header {name}: expected a number, got {raw!r}", ReasonCode.INVALID_HEADER,
                           name) from None
    if not math.isfinite(v):
        raise ServiceError(400, f"header {name}: must be finite", ReasonCode.INVALID_HEADER, name)
    return v


def build_gen_request(kind: str, body, raw: dict, headers, tenant: str) -> GenRequest:
    ext = body.tokenfair
    klass = headers.get("x-tokenfair-class") or (ext.klass if ext else None)
    deadline = _header_float(headers, "x-tokenfair-deadline-s")
    if deadline is None and ext is not None:
        deadline = ext.deadline_s
    if deadline is not None and deadline <= 0:
        raise ServiceError(400, "x-tokenfair-deadline-s: must be > 0 seconds", ReasonCode.INVALID_HEADER,
                           "x-tokenfair-deadline-s")
    priority = _header_float(headers, "x-tokenfair-priority")
    if priority is None and ext is not None:
        priority = ext.priority
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    fwd = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key")
           or k.lower().startswith("x-tokenfair-")}
    return GenRequest(kind, prefix + uuid.uuid4().hex[:24], tenant, body, raw, klass=klass or None,
                      deadline_s=deadline, priority=priority, forward_headers=fwd)


_UNION_MARK = re.compile(r"str|int|float|bool|dict|list|none|(list|dict|tuple|set|literal)\[.*\]|function-.*|"
                         r"lax-or-strict.*|json-or-python.*|constrained-.*")


def validation_message(errors) -> tuple[str, str | None]:
    parts, first = [], None
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        # drop pydantic's union-branch markers ("str", "list[int]", "function-after[...]")
        loc = [p for p in loc if not _UNION_MARK.fullmatch(p)]
        path = ".".join(loc) or "(body)"
        first = first or path
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        if e.get("type") == "json_invalid":
            msg = "body is not valid JSON"
            path = "(body)"
        parts.append(f"{path}: {msg}")
    return "; ".join(dict.fromkeys(parts)), (None if first == "(body)" else first)
