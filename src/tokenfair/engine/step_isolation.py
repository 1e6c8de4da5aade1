"""One engine step whose failures stay with the requests that caused them.

``run_isolated(runner, batch)`` runs ``runner.step(batch)``.  A fault the runner can pin on
one sequence (NaN logits, a seed its generator refuses) comes back in ``StepOutput.failed``
and costs nothing extra.  A step that *raises* is rolled back (``ModelRunner.rollback``:
every sequence's KV as before the step, decode stages dropped) and retried by halves
(bisection): the halves that run are kept, a half that raises is split again, and a single
sequence that still raises fails alone with the error as its reason: ``request_fault``
when other parts ran or the runner's previous step did (the request is to blame and a retry
elsewhere fails the same way), else ``engine_error``.  So one poisoned request
among ``n`` costs about ``2 log2 n`` extra forward passes, and the others get their token.

Invariants:
  * every sequence of ``batch`` ends in exactly one of ``sampled`` (sampled items that ran),
    ``failed`` (with a reason), or neither (a prefill chunk that ran without sampling);
  * after the call the runner's KV of a failed sequence is what it held before the step
    (the caller frees it), and of every other sequence what the step wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.reasons import Reason, ReasonCode
from .runner import ModelRunner, SeqWork

MAX_RETRY_STEPS = 64   # bound on extra forward passes for one step (then the rest fail together)


@dataclass
class IsolatedStep:
    sampled: dict[str, int] = field(default_factory=dict)   # seq_id -> token
    failed: dict[str, Reason] = field(default_factory=dict)  # seq_id -> reason
    num_retries: int = 0                                     # forward passes beyond the first
    num_parts_ran: int = 0                                   # 0: every forward pass raised


def run_isolated(runner: ModelRunner, batch: list[SeqWork], engine_ok: bool = False) -> IsolatedStep:
    """``engine_ok``: the runner's previous step ran, so a lone sequence that raises is
    blamed for it (``request_fault``) even when nothing else ran in this step."""
    res = IsolatedStep()
    pending = [batch] if batch else []
    raised: dict[str, str] = {}     # seq_id -> the error its part raised alone
    attempts = num_ran = 0
    while pending:
        part = pending.pop()
        before = {w.seq_id: (runner.cache.num_tokens(w.seq_id) if runner.cache.has_seq(w.seq_id) else None)
                  for w in part}
        attempts += 1
        try:
            out = runner.step(part)
        except Exception as err:  # noqa: BLE001 - whatever the runner raises is isolated below
            runner.rollback(before)
            if len(part) == 1 or attempts >= MAX_RETRY_STEPS:
                raised.update({w.seq_id: f"{type(err).__name__}: {err}" for w in part})
            else:
                mid = len(part) // 2
                pending += [part[mid:], part[:mid]]
            continue
        num_ran += 1
        res.sampled.update(out.sampled)
        res.failed.update(out.failed)
    # the others ran: the error is this request's own; nothing ran: the engine's
    code = ReasonCode.REQUEST_FAULT if num_ran or engine_ok else ReasonCode.ENGINE_ERROR
    res.num_parts_ran = num_ran
    res.failed.update({seq_id: Reason(code, text) for seq_id, text in raised.items()})
    res.num_retries = max(0, attempts - 1)
    return res
