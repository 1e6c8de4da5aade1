"""One step of the real engine, before the forward pass: which requests failed (each once,
with its reason) and the work the runner is given -- ``tokens[num_computed : num_computed + n]``
fed at ``start_pos = num_computed``, sampled when that reaches the end of the token list."""

from __future__ import annotations

from typing import Callable

from ..core.reasons import Reason, ReasonCode
from ..core.request import Request
from ..sched.interface import SchedulerOutput
from .kv_cache import PagedKVCache
from .runner import SeqWork
from .sequence import EngineSeq


class StepFailures:
    """The step's failed requests, each once, in the order they failed; ``finish`` ends the
    request in the engine (frees its KV) the first time it fails."""

    def __init__(self, finish: Callable[[EngineSeq, Reason], None]) -> None:
        self.finish = finish
        self.failed: list[tuple[Request, Reason]] = []
        self.failed_ids: set[str] = set()

    def fail(self, st: EngineSeq, reason: Reason) -> None:
        if st.seq_id in self.failed_ids:
            return
        self.failed_ids.add(st.seq_id)
        self.failed.append((st.req, reason))
        self.finish(st, reason)

    def unknown(self, req: Request) -> None:
        self.failed.append((req, Reason(ReasonCode.ENGINE, "unknown request (never added)")))


def work_items(out: SchedulerOutput, seqs: dict[str, EngineSeq], cache: PagedKVCache, max_pos: int,
               failures: StepFailures, synthetic_prompt: Callable[[str, int], list[int]]
               ) -> list[tuple[EngineSeq, SeqWork]]:
    """The runner's work for the scheduler's prefill chunks and decodes; a request whose
    state does not match what the scheduler feeds, or that would exceed the model's
    context, fails alone.  The scheduler's pool should guarantee KV room; if it does not,
    requests fail from the end until the rest fits."""
    items: list[tuple[EngineSeq, SeqWork]] = []
    for req, n in [(r, n) for r, n in out.prefill] + [(r, 1) for r in out.decode]:
        st = seqs.get(req.request_id)
        if st is None or st.seq_id in failures.failed_ids:
            if st is None:
                failures.unknown(req)
            continue
        if st.tokens is None:
            st.tokens = synthetic_prompt(st.seq_id, st.num_prompt)
        start = req.num_computed
        if st.num_prompt + st.target > max_pos:
            failures.fail(st, Reason(ReasonCode.EXCEEDS_MODEL_CONTEXT, f"{st.num_prompt} prompt + {st.target} "
                                                                       f"output tokens > {max_pos} positions"))
            continue
        ids = st.tokens[start:start + n]
        if len(ids) != n or cache.is_swapped(st.seq_id) or cache.num_tokens(st.seq_id) != start:
            failures.fail(st, Reason(ReasonCode.ENGINE_STATE_MISMATCH, f"scheduler feeds {n} tokens at {start}, "
                              f"engine holds {len(st.tokens)} tokens, {cache.num_tokens(st.seq_id)} cached"))
            continue
        items.append((st, SeqWork(st.seq_id, ids, start, start + n == len(st.tokens), st.sampling)))
    need = [cache.blocks_needed(w.seq_id, len(w.token_ids)) for _, w in items]
    while items and sum(need) > cache.num_free_blocks:
        st, _ = items.pop()
        need.pop()
        failures.fail(st, Reason(ReasonCode.KV_CACHE_FULL, f"engine has {cache.num_free_blocks} free blocks"))
    return items
