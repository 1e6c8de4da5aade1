"""Big request bodies are parsed and checked in a separate process, so the event loop never
waits for them.

A worker thread does not help here: ``json.loads`` and pydantic's validation are single C
calls that hold the GIL for their whole run (a 16 MiB body of 160,000 chat messages holds
it for ~0.8 s; of 4 million token ids, ~0.5 s), and every other stream waits that long for
its next chunk.  So a body over :data:`PROCESS_PARSE_BYTES` goes to one helper process
(started on the first such body) that parses and validates it and bounds its prompt from
below without a tokenizer:

  * a text prompt of ``c`` characters has at least ``c / max_token_chars`` tokens
    (:func:`tokenfair.serve.limits.min_prompt_tokens`);
  * token ids count themselves;
  * every chat message is at least one token (each template renders at least its role
    marker: ChatML's ``<|im_start|>role``).

What comes back is small for ``serve``: nothing (the body may fit: the HTTP layer parses
it itself, now that it is known to be bounded by the context), a 400 for a malformed body,
or the body with its prompt cut out plus the bound, so the request is refused
(``context_length_exceeded``) and recorded like any other without the big part being
parsed in the server.  For the gateway (``chars_per_token`` set: it forwards the prompt,
it never reads it) a valid body always comes back as the body with a stand-in for its
prompt plus the prompt as JSON bytes and its estimate (:mod:`.kept_prompt`), so the
gateway's own process never parses a big prompt either.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from ..core.reasons import ReasonCode
from .errors import ServiceError
from .kept_prompt import KeptPrompt, keep_prompt

PROCESS_PARSE_BYTES = 256 * 1024     # bodies above this are parsed in the helper process
MAX_BIG_BODIES_PER_TENANT = 2        # a tenant's big bodies waiting for the helper at once (429 beyond)


@dataclass(frozen=True)
class Verdict:
    """The helper's answer about one body (what crosses the process boundary)."""

    error: tuple | None = None          # (status, message, code, param) of a 400; None if it parsed
    min_prompt_tokens: int = 0          # >= 0: a lower bound on the prompt's tokens
    reduced: dict | None = None         # the body without its prompt, when the bound reaches the context or with kept
    kept: KeptPrompt | None = None      # the gateway's (chars_per_token given): the prompt as JSON bytes
    pid: int = 0                        # the process that judged the body


def lower_bound_tokens(kind: str, body, max_token_chars: int | None) -> int:
    """A lower bound on the prompt tokens of a validated ``body`` (see the module doc);
    without ``max_token_chars`` (the gateway), a text counts as one token."""
    from .limits import min_prompt_tokens
    if kind == "chat":
        chars = sum(len(m.text()) for m in body.messages)
        by_chars = 1 if max_token_chars is None else min_prompt_tokens(chars, max_token_chars)
        return max(len(body.messages), by_chars)
    prompt = body.prompt
    if isinstance(prompt, str):
        return 1 if max_token_chars is None else min_prompt_tokens(len(prompt), max_token_chars)
    return len(prompt)


def check_body(raw_bytes: bytes, kind: str, max_context: int | None, max_token_chars: int | None,
               chars_per_token: float | None = None) -> Verdict:
    """Run in the helper process: parse and validate; bound the prompt when the context is
    known; with ``chars_per_token`` (the gateway) keep the prompt as bytes (kept_prompt.py)."""
    import os

    from .openai_schema import ChatCompletionRequest, CompletionRequest
    from .parsing import parse_body
    model_cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
    pid = os.getpid()
    try:
        body, raw = parse_body(raw_bytes, model_cls)
    except ServiceError as err:
        return Verdict(error=(err.status, err.message, err.code, err.param), pid=pid)
    if chars_per_token is not None:
        from .gateway_context import estimate_tokens
        reduced, kept = keep_prompt(raw, kind, estimate_tokens(kind, body, chars_per_token))
        return Verdict(min_prompt_tokens=lower_bound_tokens(kind, body, max_token_chars), reduced=reduced,
                       kept=kept, pid=pid)
    if max_context is None:
        return Verdict(pid=pid)
    bound = lower_bound_tokens(kind, body, max_token_chars)
    if bound < max_context:
        return Verdict(min_prompt_tokens=bound, pid=pid)
    reduced = {k: v for k, v in raw.items() if k not in ("prompt", "messages")}
    reduced.update({"messages": [{"role": "user", "content": ""}]} if kind == "chat" else {"prompt": ""})
    return Verdict(min_prompt_tokens=bound, reduced=reduced, pid=pid)


HELPER_NICE = 10     # the helper yields the CPU to the server's engine and event loop


def _warm() -> None:
    import os

    try:        # only the CPU the server leaves idle (Linux); else a lower priority
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(HELPER_NICE)
    from . import openai_schema, parsing  # noqa: F401  (import once, before the first body)


class BodyPrechecker:
    """The helper process (one, spawned on first use -- never forked from a server with
    model threads running -- at a lower CPU priority) and the async call into it."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None
        self.num_checked = 0
        self.last_pid: int | None = None        # the helper process that judged the last body
        self.in_flight: dict[str, int] = {}     # tenant -> its bodies at the helper now (>= 1 when listed)

    async def check(self, raw_bytes: bytes, kind: str, max_context: int | None,
                    max_token_chars: int | None, tenant: str = "",
                    chars_per_token: float | None = None) -> Verdict | None:
        """The helper's verdict (a ServiceError 400 for a malformed body); None when the
        helper died or raised (the caller then parses the body itself, as a small one).
        A tenant with :data:`MAX_BIG_BODIES_PER_TENANT` bodies at the helper already gets a
        429, so one tenant's flood of big bodies cannot hold up another's."""
        if self.in_flight.get(tenant, 0) >= MAX_BIG_BODIES_PER_TENANT:
            raise ServiceError(429, f"too_many_big_bodies: tenant {tenant!r} has {MAX_BIG_BODIES_PER_TENANT} bodies "
                                    f"over {PROCESS_PARSE_BYTES // 1024} KiB being checked; retry after ~1s",
                               ReasonCode.TOO_MANY_BIG_BODIES, headers={"retry-after": "1"})
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        try:
            return await self._check(raw_bytes, kind, max_context, max_token_chars, chars_per_token)
        finally:
            self.in_flight[tenant] -= 1
            if not self.in_flight[tenant]:
                del self.in_flight[tenant]

    async def _check(self, raw_bytes: bytes, kind: str, max_context: int | None,
                     max_token_chars: int | None, chars_per_token: float | None) -> Verdict | None:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_warm)
        loop = asyncio.get_running_loop()
        try:
            verdict = await loop.run_in_executor(self.pool, check_body, raw_bytes, kind, max_context,
                                                 max_token_chars, chars_per_token)
        except BrokenProcessPool:
            self.close()
            return None
        except Exception:  # noqa: BLE001 - a helper bug: the server judges the body itself
            return None
        self.num_checked += 1
        self.last_pid = verdict.pid
        if verdict.error is not None:
            raise ServiceError(*verdict.error)
        return verdict

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
