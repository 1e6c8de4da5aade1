"""Bounded work before admission: the body size cap, the parameters refused by name, and
the cheap prompt-length bound that lets a huge prompt be refused before it is tokenized.

Everything here runs on the event loop and costs O(body) at most once:
  * :func:`read_body` reads at most ``max_body_bytes`` (413 ``body_too_large`` as soon as the
    ``Content-Length`` or the bytes read so far exceed it, before anything is parsed);
  * :func:`unsupported_params` names the OpenAI parameters that would change the result
    and that this server does not implement (400 ``unsupported_parameter``, instead of
    silently ignoring them); their neutral values (``null``, ``false``, ``[]``, 0 penalties,
    ``response_format: {"type": "text"}``, ``tool_choice: "none"``) are accepted;
  * :func:`min_prompt_tokens` is a lower bound on a text prompt's token count from its
    length (no tokenizer call): a prompt whose bound already exceeds the context is refused
    without tokenizing or templating it.
"""

from __future__ import annotations

import math

from ..core.reasons import Reason, ReasonCode
from .errors import ServiceError

OFFLOAD_PARSE_BYTES = 64 * 1024                # bodies above this are parsed in a worker thread

# name -> the values that mean "not used" (any other value is refused)
_NEUTRAL: dict[str, tuple] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, True, False), "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "suffix": (None, ""),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
}


def unsupported_params(raw: dict) -> list[str]:
    """The parameters of ``raw`` set to a value this server would have to ignore."""
    bad = []
    for name, neutral in _NEUTRAL.items():
        if name in raw and not any(raw[name] == v and type(raw[name]) is type(v) for v in neutral):
            bad.append(name)
    return bad


def refuse_unsupported(raw: dict) -> None:
    bad = unsupported_params(raw)
    if bad:
        raise ServiceError(400, f"{', '.join(bad)}: not supported by this server; remove "
                                f"{'it' if len(bad) == 1 else 'them'} or send the default value",
                           ReasonCode.UNSUPPORTED_PARAMETER, bad[0])


async def read_body(request, max_body_bytes: int) -> bytes:
    """The request body, refusing (413) one larger than ``max_body_bytes`` without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise _too_large(int(declared), max_body_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise _too_large(size, max_body_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> ServiceError:
    return ServiceError(413, f"request body of {size} bytes or more exceeds this server's limit of {limit} bytes "
                             "(--max-body-bytes)", ReasonCode.BODY_TOO_LARGE)


def min_prompt_tokens(num_chars: int, max_chars_per_token: int) -> int:
    """A lower bound on the tokens of a text of ``num_chars`` characters when no token of the
    vocabulary spells more than ``max_chars_per_token`` characters."""
    return math.ceil(num_chars / max(1, max_chars_per_token))


def max_token_chars(loaded) -> int:
    """The longest token of ``loaded``'s vocabulary in characters of decoded text (a byte-level
    token may decode to fewer characters than its byte string; never more)."""
    tok = getattr(loaded, "tokenizer", None)
    if tok is None:
        return 1
    return max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=1)


def context_refusal(num_prompt: int, asked: int | None, max_context: int, param: str,
                    qualifier: str = "") -> tuple[Reason, str] | None:
    """(reason, param) as OpenAI words it when a prompt of ``num_prompt`` tokens (``param``:
    ``prompt`` or ``messages``), or it plus the asked ``max_tokens``, does not fit
    ``max_context`` tokens; None when it fits.  ``qualifier`` ("~", "at least ") says how
    ``num_prompt`` is known when it is not counted by the tokenizer."""
    if num_prompt >= max_context:
        return (Reason(ReasonCode.CONTEXT_LENGTH_EXCEEDED, f"This model's maximum context length is {max_context} "
                f"tokens. However, your {param} resulted in {qualifier}{num_prompt} tokens. Please reduce the length "
                f"of the {param}."), param)
    if asked is not None and num_prompt + asked > max_context:
        return (Reason(ReasonCode.CONTEXT_LENGTH_EXCEEDED, f"This model's maximum context length is {max_context} "
                f"tokens. However, you requested {qualifier}{num_prompt + asked} tokens ({qualifier}{num_prompt} "
                f"in the "
                f"{param}, {asked} in the completion). Please reduce the length of the {param} or completion."),
                "max_tokens")
    return None
