"""A big body's prompt kept as JSON bytes, so the gateway forwards a body over
:data:`~tokenfair.serve.body_precheck.PROCESS_PARSE_BYTES` without parsing its prompt in
its own process.

The helper process (:mod:`.body_precheck`) parses and validates the whole body, writes the
prompt's value (``messages`` of a chat, ``prompt`` of a completion) back as JSON bytes and
estimates its tokens; the gateway parses only the rest of the body, with a *stand-in* (one
empty user message, an empty prompt) where the prompt was.  Everything the gateway reads --
``stream``, ``model``, ``max_tokens``, the ``tokenfair`` extension, ``vllm_xargs`` -- is in
that small rest, and the identity rewrite (:func:`~tokenfair.serve.backend_identity.tag_body`)
is applied to it when the request is released to a backend.  :func:`body_bytes` then puts
the kept bytes back in the stand-in's place: the main process moves the big part as bytes
(one copy), it never decodes or encodes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PROMPT_FIELD = {"chat": "messages", "completion": "prompt"}
STAND_IN: dict[str, object] = {"messages": [{"role": "user", "content": ""}], "prompt": ""}


@dataclass(frozen=True)
class KeptPrompt:
    """A validated body's prompt as the helper process wrote it (crosses the process boundary)."""

    field: str           # "messages" (chat) | "prompt" (completion): the body field it fills
    json_bytes: bytes    # that field's value as JSON (ASCII, written by json.dumps from the parsed value)
    est_tokens: int      # >= 1: the gateway's estimate of its tokens (gateway_context.estimate_tokens)


def keep_prompt(raw: dict, kind: str, est_tokens: int) -> tuple[dict, KeptPrompt]:
    """(``raw`` with the stand-in in its prompt's place, the prompt kept as JSON bytes)."""
    field = PROMPT_FIELD[kind]
    kept = KeptPrompt(field, json.dumps(raw[field]).encode(), max(1, est_tokens))
    return {**raw, field: STAND_IN[field]}, kept


def body_bytes(body: dict, kept: KeptPrompt) -> bytes:
    """``body`` as JSON bytes with ``kept`` in its prompt field (whatever ``body`` holds there);
    only the small rest of the body is encoded here."""
    rest = json.dumps({k: v for k, v in body.items() if k != kept.field}, separators=(",", ":")).encode()
    tail = b"}" if rest == b"{}" else b"," + rest[1:]
    return b"".join((b'{"', kept.field.encode(), b'":', kept.json_bytes, tail))
