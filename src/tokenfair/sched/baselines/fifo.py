"""``fifo``: vLLM V1's default scheduler (docs/SOURCES.md, "vLLM V1").

Running requests first, then waiting ones in arrival order; one shared token budget
(``prefill_token_budget + decode_token_budget`` of the contract, i.e. max_num_batched_tokens);
chunked prefill capped only by the budget; a candidate that does not fit blocks the queue;
nothing new is admitted in a step that preempted; KV shortage evicts the newest running
request by recompute, and the evicted request goes back to the *front* of the queue.
"""

from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr

from ...core.request import Request
from ..policy import Policy


@mypyc_attr(allow_interpreted_subclasses=True)
class FifoPolicy(Policy):
    name = "fifo"
    shared_budget = True
    hol_blocking = True
    supports_fast_forward = True

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def max_chunk(self) -> int:
        e = self.contract.engine
        return e.prefill_token_budget + e.decode_token_budget

    def enqueue(self, req: Request, now: float) -> None:
        if req.num_preemptions:
            self._queue.appendleft(req)   # O(1)
        else:
            self._queue.append(req)       # O(1)

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        return self._queue[0] if self._queue else None

    def take(self, req: Request) -> None:
        self._queue.popleft()             # pick always returns the head

    def discard(self, req: Request) -> None:
        self._queue.remove(req)           # O(n), only on abort

    def num_waiting(self) -> int:
        return len(self._queue)
