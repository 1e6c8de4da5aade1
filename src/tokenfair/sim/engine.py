"""A simulated continuous-batching engine: step time from the cost model, true lengths hidden.

The engine alone knows each request's true output length (the trace's ``output_tokens``);
a request finishes on the step that samples its last token.  Swap traffic adds
``profile.swap_s(tokens)`` per direction to the step.
"""

from __future__ import annotations

from ..costmodel import Profile
from ..request import Request
from ..sched.interface import SchedulerOutput, StepResult


class SimEngine:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._true_len: dict[int, int] = {}
        self.busy_s = 0.0
        self.swap_s = 0.0

    def add(self, req: Request, true_output_tokens: int) -> None:
        self._true_len[id(req)] = true_output_tokens

    def forget(self, req: Request) -> None:
        self._true_len.pop(id(req), None)

    @property
    def true_lengths(self) -> dict[int, int]:
        """id(request) -> true output length (for fast-forwarding; never for the scheduler)."""
        return self._true_len

    def steps_to_first_finish(self, running: list[Request]) -> int:
        """Steps until the first of ``running`` (all decoding) samples its last token."""
        true_len = self._true_len
        return min(true_len[id(r)] - r.num_output for r in running)

    def advance(self, durations: list[float]) -> None:
        """Account a fast-forwarded run of steps (no swaps), in the per-step order."""
        for dt in durations:
            self.busy_s += dt

    def execute(self, out: SchedulerOutput) -> StepResult:
        true_len = self._true_len
        finished = []
        prefill = []
        for req, n in out.prefill:
            prefill.append((n, req.num_computed))
            if n == req.num_uncomputed and req.num_output + 1 >= true_len[id(req)]:
                finished.append(req)
        ctx = 0
        for req in out.decode:
            ctx += req.num_computed
            if req.num_output + 1 >= true_len[id(req)]:
                finished.append(req)
        dt = self.profile.step_s(prefill, ctx, len(out.decode))
        swap_tokens = sum(r.num_computed for r, mode in out.preempted if mode == "swap")
        swap_tokens += sum(r.num_computed for r in out.swapped_in)
        swap_s = self.profile.swap_s(swap_tokens) if swap_tokens else 0.0
        self.busy_s += dt + swap_s
        self.swap_s += swap_s
        return StepResult(duration_s=dt + swap_s, finished=finished, swap_s=swap_s)
