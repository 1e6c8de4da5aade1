"""A simulated continuous-batching engine: step time from the cost model, true lengths hidden.

The engine alone knows each request's true output length (the trace's ``output_tokens``);
a request finishes on the step that samples its last token, and the engine then forgets it
(memory stays O(requests in the system), not O(requests ever seen)).  Swap traffic adds
``profile.swap_s(tokens)`` per direction to the step.
"""

from __future__ import annotations

from ..core.costmodel import Profile
from ..core.request import Request
from ..core.stepcost import StepCost
from ..sched.interface import SchedulerOutput, StepResult
from ..workloads.workload import TraceRow

class SimEngine:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.cost: StepCost = profile.cost      # step times (decode_s == profile.step_s([], ctx, n))
        self._true_len: dict[Request, int] = {}     # keyed by identity
        # output length at which each request stops (true length or max_tokens): fast-forward
        self.stop_at: dict[Request, int] = {}
        self.busy_s = 0.0
        self.swap_s = 0.0
        # request -> leading prompt tokens found in the replica's prefix cache (fleet runs with
        # prefix caching; empty otherwise): their prefill costs nothing but the context they add
        self.cached_tokens: dict[Request, int] = {}

    def add(self, req: Request, true_output_tokens: int) -> None:
        self._true_len[req] = true_output_tokens
        self.stop_at[req] = min(true_output_tokens, req.max_tokens)

    def forget(self, req: Request) -> None:
        self._true_len.pop(req, None)
        self.stop_at.pop(req, None)
        if self.cached_tokens:
            self.cached_tokens.pop(req, None)

    @property
    def true_lengths(self) -> dict[Request, int]:
        """request -> true output length (for fast-forwarding; never for the scheduler)."""
        return self._true_len

    def advance(self, durations: list[float]) -> None:
        """Account a fast-forwarded run of steps (no swaps), in the per-step order."""
        busy_s = self.busy_s
        for dt in durations:
            busy_s += dt
        self.busy_s = busy_s

    def execute(self, out: SchedulerOutput) -> StepResult:
        """O(prefills + decodes): one pass over the decodes."""
        true_len, stop_at = self._true_len, self.stop_at
        finished = [req for req, n in out.prefill
                    if n == req.num_uncomputed and req.num_output + 1 >= true_len[req]]
        prefill = [(n, req.num_computed) for req, n in out.prefill]
        if self.cached_tokens and prefill:
            prefill = self.uncached_prefill(out.prefill)
        decode = out.decode
        ending: list[Request] = []          # at their true length or max_tokens
        ctx = 0
        for req in decode:
            ctx += req.num_computed
            if req.num_output + 1 >= stop_at[req]:
                ending.append(req)
        if ending:
            finished += [req for req in ending if req.num_output + 1 >= true_len[req]]
        for req in finished + ending:         # they end this step: nothing more to know
            self.forget(req)
        dt = self.cost.step_s(prefill, ctx, len(decode))
        swap_tokens = 0
        if out.preempted:
            swap_tokens += sum(r.num_computed for r, mode in out.preempted if mode == "swap")
        if out.swapped_in:
            swap_tokens += sum(r.num_computed for r in out.swapped_in)
        swap_s = self.profile.swap_s(swap_tokens) if swap_tokens else 0.0
        self.busy_s += dt + swap_s
        self.swap_s += swap_s
        return StepResult(duration_s=dt + swap_s, finished=finished, swap_s=swap_s)

    def uncached_prefill(self, chunks: list[tuple[Request, int]]) -> list[tuple[int, int]]:
        """The step's prefill chunks as the cost model charges them: the part of each chunk
        inside its request's cached prefix is dropped (its context still counts)."""
        cached = self.cached_tokens
        charged: list[tuple[int, int]] = []
        for req, n in chunks:
            start = req.num_computed
            skip = min(n, cached.get(req, 0) - start)
            if skip > 0:
                n -= skip
                start += skip
            if n > 0:
                charged.append((n, start))
        return charged


class RowFedEngine:
    """The simulator's engine as the loop drives it: ``add`` takes the trace row (the true
    output length stays on the engine side); the fast-forward's fields pass through."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.true_lengths = engine.true_lengths
        self.stop_at = engine.stop_at
        self.cost = engine.cost
        self.profile = engine.profile

    def add(self, req: Request, row: TraceRow) -> None:
        self.engine.add(req, row.output_tokens)

    def execute(self, out: SchedulerOutput) -> StepResult:
        return self.engine.execute(out)

    def forget(self, req: Request) -> None:
        self.engine.forget(req)

    def advance(self, durations: list[float]) -> None:
        self.engine.advance(durations)

    @property
    def busy_s(self) -> float:
        return self.engine.busy_s

    def set_busy_s(self, busy_s: float) -> None:
        """A fast-forwarded run's busy time, its durations added in order (``advance``'s sum)."""
        self.engine.busy_s = busy_s
