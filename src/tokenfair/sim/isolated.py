"""Isolated baselines for slowdown: each request alone, and each tenant's traffic alone.

A request alone on an empty engine is computed in closed form from the cost model (prefill
in chunks of ``chunk`` tokens -- the reference scheduler's, ``simulate.reference_chunk`` --
then one decode step per output token it generates: its true length stopped at its
max_tokens), vectorised with numpy.  :func:`isolated_latency` does one request;
:func:`isolated_e2e` does a whole trace the same way in bulk: the prefill time once per
distinct prompt length, the decode steps of all distinct prompt lengths with the same
output length as one 2-D array summed along its rows (``np.sum(axis=1)`` over a C-contiguous
array adds each row as ``np.sum`` adds the same 1-D array: pairwise, in the same order), so
every value equals :func:`isolated_latency`'s bit for bit (``tests/test_isolated.py``).
O(output tokens of the distinct length pairs) array work, O(rows) Python work.
A tenant alone is a full simulation of its own rows under the same contract, on the
reference scheduler whatever the run's policy (``sim/simulate.py``, ``REFERENCE_POLICY``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..runtime.intake import generated_tokens
from ..workloads.workload import TraceRow

# rows of one 2-D decode array at most (memory: MAX_BLOCK_ROWS x output length floats)
MAX_BLOCK_ROWS = 4096


def _decode_step_times(profile: Profile, ctx: np.ndarray) -> np.ndarray:
    """Each decode step's seconds for contexts ``ctx`` (any shape), elementwise."""
    if profile.kind == "linear":
        return profile.decode_base_s + profile.decode_seq_s + profile.decode_ctx_s * ctx + profile.overhead_s
    L, d = profile.num_layers, profile.hidden
    flops = 2 * profile.params_nonembed + 2 * profile.vocab * d + 4 * L * d * ctx
    nbytes = 2 * profile.params_total + 4 * L * profile.d_kv * (ctx + 1)
    t = np.maximum(flops / (profile.peak_flops * profile.mfu), nbytes / (profile.bandwidth * profile.mbu))
    return t + profile.overhead_s


def _decode_steps_s(profile: Profile, ctx: np.ndarray) -> float:
    if ctx.size == 0:
        return 0.0
    return float(np.sum(_decode_step_times(profile, ctx)))


def _prefill_s(prompt_tokens: int, profile: Profile, chunk: int) -> float:
    ttft = 0.0
    done = 0
    while done < prompt_tokens:
        c = min(chunk, prompt_tokens - done)
        ttft += profile.step_s([(c, done)], 0, 0)
        done += c
    return ttft


def isolated_latency(row: TraceRow, contract: Contract, profile: Profile, chunk: int) -> tuple[float, float]:
    """(TTFT, end-to-end) of ``row`` alone on an empty engine."""
    ttft = _prefill_s(row.prompt_tokens, profile, chunk)
    ctx = np.arange(row.prompt_tokens, row.prompt_tokens + generated_tokens(row) - 1, dtype=float)
    return ttft, ttft + _decode_steps_s(profile, ctx)


def isolated_e2e(rows, contract: Contract, profile: Profile, chunk: int,
                 capacity_tokens: int | None = None) -> dict[str, float]:
    """request id -> :func:`isolated_latency`'s end-to-end seconds, for every row that can
    run (``capacity_tokens``: the KV pool's tokens; a row whose prompt does not fit is
    rejected in the run and has no baseline).  Each distinct (prompt length, output length)
    pair is computed once (performance: a trace tiled in time repeats every pair once per copy)."""
    if capacity_tokens is not None:
        rows = [r for r in rows if r.prompt_tokens + 1 <= capacity_tokens]
    ttft = {p: _prefill_s(p, profile, chunk) for p in {r.prompt_tokens for r in rows}}
    steps_of = {r.request_id: generated_tokens(r) - 1 for r in rows}
    by_steps: dict[int, dict[int, float]] = defaultdict(dict)    # decode steps -> prompt -> decode s
    for r in rows:
        by_steps[steps_of[r.request_id]][r.prompt_tokens] = 0.0
    for steps, of_prompt in by_steps.items():
        if steps <= 0:
            continue
        offsets = np.arange(steps, dtype=float)
        prompts = list(of_prompt)
        for b in range(0, len(prompts), MAX_BLOCK_ROWS):
            block = prompts[b:b + MAX_BLOCK_ROWS]
            starts = np.array(block, dtype=float)
            sums = np.sum(_decode_step_times(profile, starts[:, None] + offsets[None, :]), axis=1)
            of_prompt.update(zip(block, sums.tolist()))
    return {r.request_id: ttft[r.prompt_tokens] + by_steps[steps_of[r.request_id]][r.prompt_tokens] for r in rows}
