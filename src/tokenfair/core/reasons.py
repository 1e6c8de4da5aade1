"""Why a request ended: the closed set of reason codes (:class:`ReasonCode`) and the typed
value a request carries (:class:`Reason`: a code and a free-text detail).

Every producer (admission, deadlines, the run loop, engines, the service and gateway, the
vLLM bridge) builds a :class:`Reason`; every consumer (HTTP status, Prometheus labels,
outcome counts) reads ``reason.code``, never the text.  The text (``Reason.text``: ``"code:
detail"``, or the bare code without a detail) is what request records, JSONL files and
HTTP error bodies show.  Only a record read back from a file has nothing but that text:
:func:`code_of` is the one parser for it.

The codes also name the errors the HTTP layer answers before a request exists (a body that
is not JSON, a bad key): a load client's record of such an answer carries that code.  The
admin endpoints' error codes (``invalid_contract``, ...) answer no generation request and
are not reason codes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ReasonCode(str, enum.Enum):
    """Each code's value is its wire string (records, error bodies, metric labels)."""

    # -- finished
    EOS_OR_LENGTH = "eos_or_length"          # the engine ended it (end of sequence / its true length)
    MAX_TOKENS = "max_tokens"                # it generated its max_tokens
    BACKEND_STOP = "backend_stop"            # gateway: the backend finished it, finish_reason "stop"
    BACKEND_LENGTH = "backend_length"        # gateway: the backend finished it, finish_reason "length"
    BACKEND_TOOL_CALLS = "backend_tool_calls"          # gateway: ... finish_reason "tool_calls"
    BACKEND_CONTENT_FILTER = "backend_content_filter"  # gateway: ... finish_reason "content_filter"
    BACKEND_FINISHED = "backend_finished"    # gateway: the backend finished it with another finish_reason (detail)
    VLLM = "vllm"                            # vLLM plugin: vLLM ended it (detail: vLLM's request status)
    COMPLETED = "completed"                  # load client: the server answered in full
    # -- rejected at arrival
    QUEUE_FULL = "queue_full"                # the tenant already has max_queued requests waiting
    OVERLOADED = "overloaded"                # shed: its predicted wait exceeds shed_margin x max_wait_s
    RATE_LIMITED = "rate_limited"            # its tenant's token bucket cannot admit it within its max wait
    CLASS_NOT_ALLOWED = "class_not_allowed"  # the contract does not let its tenant use its class
    PROMPT_EXCEEDS_KV_CAPACITY = "prompt_exceeds_kv_capacity"  # its prompt can never fit the KV pool
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"        # prompt (+ max_tokens) over the model's context
    SHUTTING_DOWN = "shutting_down"          # serve/gateway: the server is stopping; nothing new is accepted
    NO_BACKEND = "no_backend"                # serve/gateway: no engine or backend can take it (down / broken)
    INVALID_ROW = "invalid_row"              # soak benchmark: the trace row is not a valid request
    # -- expired
    DEADLINE_INFEASIBLE = "deadline_infeasible"  # waiting, it can no longer finish before its deadline
    # -- failed
    UNSCHEDULABLE = "unschedulable"          # no resource can ever admit it (the run would hang)
    SHUTDOWN = "shutdown"                    # the server or gateway stopped while it was held
    CLIENT_DISCONNECTED = "client_disconnected"  # the client closed the connection
    ENGINE_REJECTED = "engine_rejected"      # serve: the engine refused to add it
    ENGINE_ERROR = "engine_error"            # serve: an engine step raised or ran nothing, or the worker stopped
    FAILED = "failed"                        # serve: the engine broke; every request it still held fails
    ENGINE = "engine"                        # real engine: a step named a request it never added
    EXCEEDS_MODEL_CONTEXT = "exceeds_model_context"  # real engine: prompt + output over the model's context
    ENGINE_STATE_MISMATCH = "engine_state_mismatch"  # real engine: scheduler and engine disagree on its KV
    KV_CACHE_FULL = "kv_cache_full"          # real engine: no free KV block for it
    SWAP_IN = "swap_in"                      # real engine: its swapped-out KV could not be brought back
    REQUEST_ERROR = "request_error"          # real engine: its own step work raised
    INVALID_SAMPLING = "invalid_sampling"    # real engine: its sampling parameters cannot be applied
    NON_FINITE_LOGITS = "non_finite_logits"  # real engine: the model gave NaN/inf logits for it
    REQUEST_FAULT = "request_fault"          # its own event handling raised (detokenizer, stop strings)
    BACKEND_UNAVAILABLE = "backend_unavailable"  # gateway: its backend cannot be reached or went down
    BACKEND_ERROR = "backend_error"          # gateway: its backend's stream broke or sent an error
    BACKEND_STATUS = "backend_status"        # gateway: its backend answered an error status without a code
    GATEWAY_ERROR = "gateway_error"          # gateway: its proxy task crashed or ended early
    # -- HTTP errors before a request exists (error bodies; a load client's records)
    INVALID_REQUEST = "invalid_request"      # the body fails validation
    INVALID_JSON = "invalid_json"            # the body is not JSON
    INVALID_HEADER = "invalid_header"        # an x-tokenfair-* header is malformed
    UNSUPPORTED_PARAMETER = "unsupported_parameter"  # the body asks for a feature this server lacks
    NO_TOKENIZER = "no_tokenizer"            # text prompt, but the model has no tokenizer
    BODY_TOO_LARGE = "body_too_large"        # the body is over the server's size limit
    TOO_MANY_BIG_BODIES = "too_many_big_bodies"  # the tenant has too many big bodies being parsed
    MODEL_NOT_FOUND = "model_not_found"      # the body names a model this server does not serve
    INVALID_API_KEY = "invalid_api_key"      # no key, or a key that names no tenant
    # -- fallbacks of a stored text (code_of)
    UNSPECIFIED = "unspecified"              # a stored record without a reason
    OTHER = "other"                          # a stored reason whose code is none of the above


# the codes a Reason may not be built with: they only describe a stored text
FALLBACK_CODES = frozenset({ReasonCode.UNSPECIFIED, ReasonCode.OTHER})
BY_VALUE = {c.value: c for c in ReasonCode}


@dataclass(frozen=True, slots=True)
class Reason:
    """Why one request ended.  ``code`` decides (HTTP status, labels, outcomes); ``detail``
    is free text for people (may be ""); ``text`` is the rendered ``"code: detail"``."""

    code: ReasonCode
    detail: str = ""
    text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", f"{self.code.value}: {self.detail}" if self.detail else self.code.value)

    def __str__(self) -> str:
        return self.text


def code_of(text: str | None) -> ReasonCode:
    """The code of a reason stored as text (a record read back from a JSONL file, a load
    client's record): the text before its first ``:``.  This is the one parser of stored
    reasons; live code reads ``Reason.code``.  No text -> ``UNSPECIFIED``; a code outside
    the set (another server's error code, a malformed line) -> ``OTHER``."""
    if not text:
        return ReasonCode.UNSPECIFIED
    return BY_VALUE.get(text.split(":", 1)[0].strip(), ReasonCode.OTHER)


def from_upstream(code: str | None, fallback: ReasonCode, detail: str) -> Reason:
    """A gateway's reason for another server's error ``code`` (a value of its error body, not
    a reason text of ours): that code when it is one of ours (a tokenfair backend's
    ``queue_full`` stays ``queue_full``), else ``fallback`` with the foreign code leading
    the detail."""
    own = BY_VALUE.get(code) if code else None
    if own is not None and own not in FALLBACK_CODES:
        return Reason(own, detail)
    return Reason(fallback, f"{code}: {detail}" if code else detail)


# the gateway's reason code for each finish_reason a backend may end a stream with
BACKEND_FINISH_CODES = {"stop": ReasonCode.BACKEND_STOP, "length": ReasonCode.BACKEND_LENGTH,
                        "tool_calls": ReasonCode.BACKEND_TOOL_CALLS,
                        "content_filter": ReasonCode.BACKEND_CONTENT_FILTER}


def backend_finished(finish_reason: str) -> Reason:
    """Why the gateway ends a request its backend finished with ``finish_reason``."""
    code = BACKEND_FINISH_CODES.get(finish_reason)
    return Reason(code) if code is not None else Reason(ReasonCode.BACKEND_FINISHED, finish_reason)


# reasons several producers share
ENDED_BY_ENGINE = Reason(ReasonCode.EOS_OR_LENGTH)
REACHED_MAX_TOKENS = Reason(ReasonCode.MAX_TOKENS)
NEVER_ADMITTED = Reason(ReasonCode.UNSCHEDULABLE, "no resource can ever admit it")
CLIENT_CLOSED = Reason(ReasonCode.CLIENT_DISCONNECTED, "the client closed the connection")
