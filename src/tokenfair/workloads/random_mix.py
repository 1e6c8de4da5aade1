"""Random tenant mixes with random contracts: workloads the built-in scenarios do not cover,
to check that the fair policy's acceptance holds in general (``scripts/outside_acceptance.py``).

``random_mix(seed)`` draws, from ``numpy.random.default_rng([seed, RANDOM_MIX_STREAM])``:

* a trace of 180, 240 or 300 s;
* two classes: ``interactive`` (priority 20, max wait 30 or 60 s, TTFT SLO 1, 2 or 5 s, TPOT
  SLO 0.05, 0.1 or 0.2 s) and ``batch`` (priority 0, max wait 120, 300 or 600 s, no SLO);
* 1-9 small tenants (``s0``...: interactive, 0.1-1 requests/s, median prompt 100-2,500
  tokens, median output 50-500), 0-2 heavy ones (``h0``, ``h1``: interactive or batch, 2-8
  requests/s, median prompt 500-4,000, median output 100-600) and, two times in five, a
  ``burst`` of 20-80 requests/s for 2-8 s of 1,000-16,000-token prompts in the batch class;
* weights 1-3 (the burst's 1), a prefill budget of 1,024 or 2,048 tokens and 64 or 256
  running slots; lengths lognormal around their medians (``scenarios.poisson_stream``).

Its *light* tenants are those that ask for less than half their weight share of all the
tokens asked: the fair policy protects their latency.
"""

from __future__ import annotations

import argparse
from typing import Final

import numpy as np

from ..contracts.contract import Contract, parse_contract
from .scenarios import poisson_stream, stream_workload
from .workload import TraceRow, Workload

RANDOM_MIX_STREAM: Final = 777           # the generator's stream, apart from the scenarios'
LIGHT_SHARE_FRACTION: Final = 0.5        # light: asks for less than this x its weight share


def random_mix(seed: int) -> tuple[Workload, Contract, tuple[str, ...]]:
    """(workload, contract, light tenants) of mix ``seed`` (module docstring)."""
    rng = np.random.default_rng([seed, RANDOM_MIX_STREAM])
    dur = float(rng.choice([180, 240, 300]))
    classes = {
        "interactive": {"priority": 20, "aging_rate": 1.0, "max_wait_s": float(rng.choice([30, 60])),
                        "ttft_slo_s": float(rng.choice([1.0, 2.0, 5.0])),
                        "tpot_slo_s": float(rng.choice([0.05, 0.1, 0.2]))},
        "batch": {"priority": 0, "aging_rate": 0.5, "max_wait_s": float(rng.choice([120, 300, 600]))},
    }
    items: list[tuple] = []
    tenants: dict[str, dict] = {}
    n_small, n_heavy, burst = int(rng.integers(1, 10)), int(rng.integers(0, 3)), bool(rng.random() < 0.4)
    for k in range(n_small):
        items += poisson_stream(rng, f"s{k}", float(rng.uniform(0.1, 1.0)), 0, dur,
                                (int(rng.integers(100, 2500)), 0.5, 16, 8000),
                                (int(rng.integers(50, 500)), 0.5, 8, 1500), "interactive")
        tenants[f"s{k}"] = {"weight": int(rng.integers(1, 4)), "default_class": "interactive"}
    for k in range(n_heavy):
        rate, klass = float(rng.uniform(2, 8)), str(rng.choice(["interactive", "batch"]))
        items += poisson_stream(rng, f"h{k}", rate, 0, dur, (int(rng.integers(500, 4000)), 0.7, 32, 16000),
                                (int(rng.integers(100, 600)), 0.7, 8, 2000), klass)
        tenants[f"h{k}"] = {"weight": int(rng.integers(1, 4)), "default_class": klass, "max_queued": 20000}
    if burst:
        t0, rate = float(rng.uniform(20, dur / 2)), float(rng.uniform(20, 80))
        items += poisson_stream(rng, "burst", rate, t0, t0 + float(rng.uniform(2, 8)),
                                (int(rng.integers(3000, 12000)), 0.2, 1000, 16000),
                                (int(rng.integers(50, 300)), 0.5, 8, 600), "batch")
        tenants["burst"] = {"weight": 1, "default_class": "batch", "max_queued": 20000}
    contract = parse_contract({
        "version": f"random-mix-{seed}", "tenants": tenants, "default_tenant": {"weight": 1},
        "classes": classes, "default_class": "interactive",
        "costs": {"prefill_token": 1.0, "decode_token": 2.0},
        "engine": {"prefill_token_budget": int(rng.choice([1024, 2048])), "decode_token_budget": 256,
                   "chunk_size": 512, "max_running": int(rng.choice([64, 256]))},
        "preemption": {"mode": "auto", "max_per_request": 2, "min_benefit_ratio": 2.0, "cooldown_s": 1.0},
    }, f"random mix {seed}")
    wl = stream_workload(f"random-mix-{seed}", items)
    return wl, contract, light_tenants(wl.rows, contract)


def light_tenants(rows: tuple[TraceRow, ...], contract: Contract) -> tuple[str, ...]:
    """The tenants asking for less than ``LIGHT_SHARE_FRACTION`` of their weight share of all
    the tokens (prompt + output) asked, in first-seen order."""
    asked: dict[str, int] = {}
    for r in rows:
        asked[r.tenant] = asked.get(r.tenant, 0) + r.prompt_tokens + r.output_tokens
    total = sum(asked.values())
    weight = {t: contract.tenant(t).weight for t in asked}
    total_weight = sum(weight.values())
    return tuple(t for t, n in asked.items()
                 if n / total < LIGHT_SHARE_FRACTION * weight[t] / total_weight)


def seed_range(text: str) -> list[int]:
    """The seeds ``N`` or ``LO-HI`` (inclusive, 0 <= LO <= HI) name, for the scripts that run
    the mixes; ValueError naming the form for anything else."""
    lo, _, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"{text!r} is not a seed or a range LO-HI (e.g. 0-59)") from None
    if first < 0 or last < first:
        raise ValueError(f"{text!r}: give LO-HI with 0 <= LO <= HI (e.g. 0-59)")
    return list(range(first, last + 1))


def seed_range_arg(text: str) -> list[int]:
    """:func:`seed_range` as an argparse ``type``: a bad range is a usage error (exit 2)."""
    try:
        return seed_range(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
