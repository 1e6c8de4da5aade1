"""The six built-in stress scenarios, one per classic way scheduling goes unfair.

Each is a seeded generator (``numpy.random.Generator``) of a trace plus the contract an
operator would write for it (``data/contracts/<name>.yaml``).  Poisson arrivals; lengths
log-normal around the stated medians, clipped.

* ``hol``   -- a chat tenant's short requests behind 20K-token document prompts.
* ``whale`` -- a whale and a mid tenant that both ask for more than their share, four small
  tenants sending RAG-sized prompts now and then.
* ``flood`` -- sustained front-end (interactive) flood next to a low-priority batch class.
* ``burst`` -- streaming decodes, then a burst of 8K-token prefills from a bulk tenant.
* ``burst-long`` -- six streaming tenants; a few hundred 6-12K-token prompts arrive within
  seconds in a class with a 120 s max wait: the engine can serve most of them in time, so
  shedding them at arrival would refuse work it could have done.
* ``many-light`` -- twenty small tenants that together more than saturate the engine, next
  to one whale that is backlogged throughout: "light first" must not starve the whale, and
  every backlogged tenant is owed its share.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from ..contracts.contract import Contract, load_contract
from .workload import TraceRow, Workload

SCENARIOS = ("hol", "whale", "flood", "burst", "burst-long", "many-light")


def poisson_stream(rng: np.random.Generator, tenant: str, rate: float, t0: float, t1: float,
            prompt: tuple[int, float, int, int], output: tuple[int, float, int, int],
            klass: str | None = None) -> list[tuple]:
    """Poisson arrivals in [t0, t1); lengths ~ lognormal(median, sigma) clipped to [lo, hi]."""
    n = rng.poisson(rate * (t1 - t0))
    times = np.sort(rng.uniform(t0, t1, n))
    def draw(spec):
        med, sigma, lo, hi = spec
        return np.clip(np.round(med * np.exp(rng.normal(0, sigma, n))), lo, hi).astype(int)
    ps, os_ = draw(prompt), draw(output)
    return [(float(t), tenant, int(p), int(o), klass) for t, p, o in zip(times, ps, os_)]


def stream_workload(name: str, items: list[tuple]) -> Workload:
    """``items`` (``poisson_stream``'s tuples) as workload ``name``: in arrival order (ties by
    tenant), request ids ``name-000000``...; sorts ``items`` in place."""
    items.sort(key=lambda x: (x[0], x[1]))
    rows = tuple(TraceRow(request_id=f"{name}-{i:06d}", arrival_s=round(t, 6), tenant=ten,
                          prompt_tokens=p, output_tokens=o, klass=k)
                 for i, (t, ten, p, o, k) in enumerate(items))
    return Workload(name, rows)


def _hol(rng: np.random.Generator) -> list[tuple]:
    dur = 300.0
    return (poisson_stream(rng, "chat", 3.5, 0, dur, (800, 0.5, 32, 3000), (150, 0.6, 8, 800))
            + poisson_stream(rng, "docs", 0.4, 0, dur, (20000, 0.05, 18000, 22000), (200, 0.5, 16, 800)))


def _whale(rng: np.random.Generator) -> list[tuple]:
    dur = 300.0
    items = (poisson_stream(rng, "whale", 6.0, 0, dur, (1000, 0.7, 32, 8000), (300, 0.7, 8, 1500))
             + poisson_stream(rng, "mid", 5.0, 0, dur, (800, 0.7, 32, 8000), (300, 0.7, 8, 1500)))
    for k in range(4):
        items += poisson_stream(rng, f"small-{k}", 0.3, 0, dur, (1500, 0.5, 64, 6000), (150, 0.6, 8, 800))
    return items


def _flood(rng: np.random.Generator) -> list[tuple]:
    dur = 300.0
    return (poisson_stream(rng, "frontend", 10.0, 0, dur, (800, 0.6, 32, 6000), (250, 0.6, 8, 1200), "interactive")
            + poisson_stream(rng, "frontend", 2.0, 0, dur, (300, 0.5, 16, 2000), (80, 0.5, 4, 400), "realtime")
            + poisson_stream(rng, "analytics", 1.5, 0, dur, (2000, 0.5, 64, 8000), (400, 0.5, 16, 1500), "batch"))


def _burst(rng: np.random.Generator) -> list[tuple]:
    dur = 240.0
    return (poisson_stream(rng, "stream", 4.0, 0, dur, (300, 0.5, 16, 2000), (600, 0.4, 50, 2000))
            + poisson_stream(rng, "bulk", 40.0, 60.0, 65.0, (8000, 0.1, 6000, 10000), (50, 0.5, 4, 300)))


def _burst_long(rng: np.random.Generator) -> list[tuple]:
    dur = 240.0
    items: list[tuple] = []
    for k in range(6):
        items += poisson_stream(rng, f"stream-{k}", 0.6, 0, dur, (300, 0.5, 16, 2000), (500, 0.4, 50, 2000))
    return items + poisson_stream(rng, "docs", 50.0, 60.0, 64.0, (9000, 0.2, 6000, 12000), (120, 0.5, 8, 600))


def _many_light(rng: np.random.Generator) -> list[tuple]:
    dur = 240.0
    items = poisson_stream(rng, "whale", 1.0, 0, dur, (2000, 0.5, 128, 8000), (400, 0.5, 16, 1500))
    for k in range(20):
        items += poisson_stream(rng, f"light-{k:02d}", 0.5, 0, dur, (1500, 0.4, 64, 6000), (250, 0.4, 8, 1000))
    return items


_GENERATORS = {"hol": _hol, "whale": _whale, "flood": _flood, "burst": _burst, "burst-long": _burst_long,
               "many-light": _many_light}


def scenario_contract(name: str) -> Contract:
    with resources.as_file(resources.files("tokenfair") / "data" / "contracts" / f"{name}.yaml") as p:
        return load_contract(p)


def build_scenario(name: str, seed: int = 0) -> tuple[Workload, Contract]:
    if name not in _GENERATORS:
        raise KeyError(f"unknown scenario {name!r}; built-in scenarios: {', '.join(SCENARIOS)}")
    rng = np.random.default_rng([seed, SCENARIOS.index(name)])
    return stream_workload(name, _GENERATORS[name](rng)), scenario_contract(name)
