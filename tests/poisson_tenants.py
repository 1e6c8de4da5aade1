"""Seeded Poisson workloads for the policy tests: each tenant a stream of requests with
log-normal lengths (``workloads.scenarios.poisson_stream``), and the fair policy's
fairness figures on one."""

from __future__ import annotations

import numpy as np

from tokenfair.contracts.contract import Contract, parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.scenarios import poisson_stream
from tokenfair.workloads.workload import TraceRow, Workload

ENGINE = {"prefill_token_budget": 1024, "decode_token_budget": 256, "chunk_size": 512, "max_running": 256}


def contract_of(tenants: dict, classes: dict) -> Contract:
    """A contract of ``tenants`` and ``classes`` (the first class is the default) on the
    scenarios' engine budgets."""
    return parse_contract({"tenants": tenants, "classes": classes, "default_class": next(iter(classes)),
                           "engine": ENGINE})


def poisson_workload(name: str, seed: int, streams: list[tuple]) -> Workload:
    """``streams``: ``(tenant, rate, t0, t1, prompt, output)`` each, lengths as
    ``(median, sigma, lo, hi)``; one generator seeded ``seed`` draws them in order."""
    rng = np.random.default_rng(seed)
    items = [x for tenant, rate, t0, t1, prompt, output in streams
             for x in poisson_stream(rng, tenant, rate, t0, t1, prompt, output)]
    items.sort(key=lambda x: (x[0], x[1]))
    return Workload(name, tuple(TraceRow(f"r-{i:05d}", round(t, 6), tenant, p, o)
                                for i, (t, tenant, p, o, _) in enumerate(items)))


def fair_fairness(workload: Workload, contract: Contract) -> dict:
    """The fair policy's ``summary["fairness"]`` on ``workload`` (default profile)."""
    return simulate(workload, "fair", contract, load_profile(None), isolated=False).summary["fairness"]
