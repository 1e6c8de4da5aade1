"""OpenAI-compatible request and response models (``/v1/chat/completions``, ``/v1/completions``).

Requests are validated with pydantic v2 in strict mode (``"stream": "yes"``, ``"max_tokens":
"2"`` or ``prompt: [true]`` are 400s; an integer is accepted where a number is).  Unknown
fields are *ignored*, except the OpenAI parameters that change results and that this server
does not implement: those are refused by name (:mod:`tokenfair.serve.limits`), as are
``n > 1``, ``echo``, ``best_of > 1`` and batched prompts.  Extensions:

  * ``ignore_eos`` (bool, vLLM's name): generate exactly ``max_tokens`` tokens;
  * ``tokenfair``: ``{"class": str, "deadline_s": float, "priority": float}`` -- the same as
    the ``x-tokenfair-class`` / ``x-tokenfair-deadline-s`` / ``x-tokenfair-priority``
    headers (headers win).  The contract decides: a request may only ask for a *lower*
    priority and a *later* deadline than its class gives (``intake.make_request``).

Responses follow OpenAI's shapes.  Streaming sends ``data: {chunk}\\n\\n`` server-sent
events and ends with ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk
with empty ``choices`` carries ``usage``.  Errors are ``{"error": {"message", "type",
"param", "code"}}``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..engine.seed_range import MAX_SEED_EXCLUSIVE, MIN_SEED


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)


class TokenfairOptions(BaseModel):
    """Per-request scheduling wishes; the contract clamps them (never raises a priority)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    klass: str | None = Field(default=None, alias="class")
    deadline_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    priority: float | None = Field(default=None, allow_inf_nan=False)


class StreamOptions(_Lenient):
    include_usage: bool = False


class ContentPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise ValueError(f"content part of type {p.type!r} is not supported; send text parts only")
            parts.append(p.text)
        return "".join(parts)


class _GenerationParams(_Lenient):
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=MIN_SEED, lt=MAX_SEED_EXCLUSIVE)
    ignore_eos: bool = False
    user: str | None = None
    tokenfair: TokenfairOptions | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list):
            if len(v) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(s == "" for s in v):
                raise ValueError("stop sequences must be non-empty")
        elif v == "":
            raise ValueError("stop sequences must be non-empty")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_GenerationParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _texts(self) -> "ChatCompletionRequest":
        for m in self.messages:
            m.text()      # raises on non-text content parts
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationParams):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v):
        if isinstance(v, list):
            if len(v) == 0:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], (str, list)):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
                v = v[0]
                if isinstance(v, list) and not v:
                    raise ValueError("prompt must not be empty")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v):
        if v not in (None, 1):
            raise ValueError("best_of > 1 is not supported")
        return v

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


# ------------------------------------------------------------------- responses
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> "Usage":
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


ChoiceT = TypeVar("ChoiceT", ChatChoice, CompletionChoice)


class GenerationResponse(BaseModel, Generic[ChoiceT]):
    """A non-streamed generation's body; each route names its ``object`` (a subclass keeps
    the field's place)."""
    id: str
    object: str
    created: int
    model: str
    choices: list[ChoiceT]
    usage: Usage


class ChatCompletionResponse(GenerationResponse[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"


class CompletionResponse(GenerationResponse[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenfair"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# ---------------------------------------------------------------- builders
def now_s() -> int:
    return int(time.time())


def full_response(kind: str, rid: str, model: str, text: str, finish_reason: str | None,
                  prompt_tokens: int, completion_tokens: int) -> dict:
    usage = Usage.of(prompt_tokens, completion_tokens)
    if kind == "chat":
        return ChatCompletionResponse(id=rid, created=now_s(), model=model, usage=usage, choices=[
            ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)]).model_dump()
    return CompletionResponse(id=rid, created=now_s(), model=model, usage=usage, choices=[
        CompletionChoice(text=text, finish_reason=finish_reason)]).model_dump()


def stream_chunk(kind: str, rid: str, model: str, created: int, text: str | None = None,
                 finish_reason: str | None = None, role: bool = False) -> dict:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``)."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}]}


def usage_chunk(kind: str, rid: str, model: str, created: int, prompt_tokens: int, completion_tokens: int) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": Usage.of(prompt_tokens, completion_tokens).model_dump()}


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
               499: "client_closed_request", 500: "server_error", 502: "bad_gateway",
               503: "service_unavailable", 504: "deadline_exceeded"}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return ErrorResponse(error=ErrorBody(message=message, type=ERROR_TYPES.get(status, "error"),
                                         param=param, code=code)).model_dump()
