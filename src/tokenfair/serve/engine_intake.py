"""What ``serve`` checks about one request before the scheduler sees it: the prompt's token
ids (chat template + tokenizer, or ids checked against the vocabulary), the sampling
parameters (a 400 naming the field, so a bad seed never reaches a batch), and the context
(prompt + ``max_tokens`` within the model's context, refused as OpenAI does:
400 ``context_length_exceeded``).

Tokenizing and templating run in a worker thread (``EngineBackend.prepare``); before that,
:func:`prompt_chars` and :func:`tokenfair.serve.limits.min_prompt_tokens` bound the token
count from the text's length, so a prompt far beyond the context is refused without being
tokenized.
"""

from __future__ import annotations

from ..engine.sampling import InvalidSamplingError, SamplingParams
from ..core.reasons import Reason, ReasonCode
from .errors import ServiceError
from . import limits
from .jobs import GenRequest


def prompt_chars(g: GenRequest) -> int | None:
    """Characters of a text prompt (the messages' texts for chat); None for token ids."""
    body = g.body
    if g.kind == "chat":
        return sum(len(m.text()) for m in body.messages)
    return len(body.prompt) if isinstance(body.prompt, str) else None


def prompt_param(g: GenRequest) -> str:
    return "messages" if g.kind == "chat" else "prompt"


def tokenize_prompt(g: GenRequest, loaded, vocab_size: int) -> list[int]:
    """The prompt's token ids; a ServiceError 400 for what the request got wrong."""
    body = g.body
    has_tokenizer = loaded is not None and loaded.tokenizer is not None
    if g.kind == "chat":
        if not has_tokenizer:
            raise ServiceError(400, "this model has no tokenizer; use /v1/completions with token ids",
                               ReasonCode.NO_TOKENIZER, "messages")
        msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = loaded.apply_chat_template(msgs)
        except Exception as err:  # noqa: BLE001 - template errors are the request's fault
            raise ServiceError(400, f"messages: cannot apply the chat template: {err}", ReasonCode.INVALID_REQUEST,
                               "messages") from None
        return _encode(loaded, text, "messages")
    prompt = body.prompt
    if isinstance(prompt, str):
        if not has_tokenizer:
            raise ServiceError(400, "this model has no tokenizer; send prompt as token ids", ReasonCode.NO_TOKENIZER,
                               "prompt")
        return _encode(loaded, prompt, "prompt")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ServiceError(400, f"prompt: token id {bad[0]} outside the vocabulary [0, {vocab_size})",
                           ReasonCode.INVALID_REQUEST, "prompt")
    return list(prompt)


def _encode(loaded, text: str, param: str) -> list[int]:
    try:
        return loaded.encode(text)
    except Exception as err:  # noqa: BLE001 - a text the tokenizer cannot take is the request's fault
        raise ServiceError(400, f"{param}: the tokenizer cannot encode it: {type(err).__name__}: {err}",
                           ReasonCode.INVALID_REQUEST, param) from None


def sampling_of(body) -> SamplingParams:
    """The request's sampling parameters (temperature defaults to 1 as in OpenAI's API)."""
    try:
        return SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                              top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed)
    except InvalidSamplingError as err:
        raise ServiceError(400, str(err), ReasonCode.INVALID_REQUEST, err.param) from None


def context_refusal(num_prompt: int, asked: int | None, max_context: int, g: GenRequest) -> tuple[Reason, str] | None:
    """(reason, param) when the prompt, or the prompt plus the asked ``max_tokens``, does not
    fit ``max_context`` tokens; None when it fits (an unset ``max_tokens`` is then clamped)."""
    return limits.context_refusal(num_prompt, asked, max_context, prompt_param(g))
