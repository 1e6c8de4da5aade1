"""Isolated baselines for slowdown: each request alone, and each tenant's traffic alone.

A request alone on an empty engine is computed in closed form from the cost model (prefill
in chunks of ``min(chunk_size, prefill_token_budget)``, then one decode step per output
token), vectorised with numpy: O(output_tokens) array work per request, no Python loop.
A tenant alone is a full simulation of its own rows under the same policy and contract.
"""

from __future__ import annotations

import numpy as np

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..workloads.workload import TraceRow


def _decode_steps_s(profile: Profile, ctx: np.ndarray) -> float:
    if ctx.size == 0:
        return 0.0
    if profile.kind == "linear":
        return float(np.sum(profile.decode_base_s + profile.decode_seq_s + profile.decode_ctx_s * ctx
                            + profile.overhead_s))
    L, d = profile.num_layers, profile.hidden
    flops = 2 * profile.params_nonembed + 2 * profile.vocab * d + 4 * L * d * ctx
    nbytes = 2 * profile.params_total + 4 * L * profile.d_kv * (ctx + 1)
    t = np.maximum(flops / (profile.peak_flops * profile.mfu), nbytes / (profile.bandwidth * profile.mbu))
    return float(np.sum(t + profile.overhead_s))


def isolated_latency(row: TraceRow, contract: Contract, profile: Profile, chunk: int) -> tuple[float, float]:
    """(TTFT, end-to-end) of ``row`` alone on an empty engine."""
    ttft = 0.0
    done = 0
    while done < row.prompt_tokens:
        c = min(chunk, row.prompt_tokens - done)
        ttft += profile.step_s([(c, done)], 0, 0)
        done += c
    ctx = np.arange(row.prompt_tokens, row.prompt_tokens + row.output_tokens - 1, dtype=float)
    return ttft, ttft + _decode_steps_s(profile, ctx)


def isolated_e2e(rows, contract: Contract, profile: Profile, chunk: int) -> dict[str, float]:
    return {r.request_id: isolated_latency(r, contract, profile, chunk)[1] for r in rows}
