"""The gateway's context check (``--max-context``): refused as OpenAI refuses, 400
``context_length_exceeded``, only when it is certain -- the gateway has no tokenizer.

What the gateway knows for sure about a prompt's tokens: token ids count themselves, a chat
message is at least one token (every template renders at least its role marker), a text
prompt at least one.  So it refuses when that lower bound alone, or the bound plus the asked
``max_tokens``, does not fit; when only its estimate (characters / ``chars_per_token``) says
the request would not fit, the request goes on and the backend, which tokenizes, decides
(its 400 and its ``param`` come back unchanged, and are not retried elsewhere).  An asked
``max_tokens`` is never clamped; without one, the request's charge assumes no more output
than the estimate leaves in the context.
"""

from __future__ import annotations

import math

from ..core.reasons import Reason
from . import limits
from .jobs import GenRequest


def estimate_tokens(kind: str, body, chars_per_token: float) -> int:
    """The gateway's estimate of a validated body's prompt tokens (it has no tokenizer):
    characters / ``chars_per_token`` (+4 per chat message); token-id prompts are exact."""
    if kind == "chat":
        return max(1, sum(4 + math.ceil(len(m.text()) / chars_per_token) for m in body.messages))
    p = body.prompt
    if isinstance(p, str):
        return max(1, math.ceil(len(p) / chars_per_token))
    return max(1, len(p))


def min_prompt_tokens(g: GenRequest) -> int:
    """A lower bound on ``g``'s prompt tokens without a tokenizer."""
    body = g.body
    if g.kind == "chat":
        floor = len(body.messages)
    else:
        floor = 1 if isinstance(body.prompt, str) else len(body.prompt)
    return max(1, floor, g.min_prompt_tokens)      # min_prompt_tokens: a big body's, from body_precheck


def context_refusal(g: GenRequest, est: int, asked: int | None, max_context: int) -> tuple[Reason, str] | None:
    """(reason, param) when ``g`` cannot fit ``max_context`` tokens; None otherwise.
    ``est``: the gateway's estimate of the prompt's tokens (enough to refuse the prompt alone)."""
    param = "messages" if g.kind == "chat" else "prompt"
    floor = min_prompt_tokens(g)
    if est > floor:
        prompt_alone = limits.context_refusal(est, None, max_context, param, "~")
        if prompt_alone is not None:
            return prompt_alone
    return limits.context_refusal(floor, asked, max_context, param, "at least ")
