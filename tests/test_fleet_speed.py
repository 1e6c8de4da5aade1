"""The fleet loop's performance measures change nothing but speed: the collector is paused
while the loop runs (and back as it was after), the shortcut of ``add_repeated`` agrees with
the loop on the values its bound rules out."""

import gc
import math

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.exactfloat import add_repeated
from tokenfair.sim import fleet
from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
from tokenfair.workloads.scenarios import build_scenario


def test_the_collector_is_paused_in_the_fleet_loop_and_restored_after(monkeypatch):
    seen: list[bool] = []
    make = fleet.make_router

    def watching_router(name, load_bound):
        router = make(name, load_bound)
        choose = router.choose

        def watched(replicas, hashes):
            seen.append(gc.isenabled())
            return choose(replicas, hashes)
        router.choose = watched
        return router

    monkeypatch.setattr(fleet, "make_router", watching_router)
    wl, contract = build_scenario("burst", 0)
    assert gc.isenabled()
    run = simulate_fleet_once(wl, "vtc", contract or parse_contract({}), load_profile(None),
                              FleetConfig(num_replicas=3))
    assert seen and not any(seen)            # every routing decision ran with the collector off
    assert gc.isenabled()
    assert len(run.requests) == len(wl.rows)


def _loop(acc: float, x: float, k: int) -> float:
    for _ in range(k):
        acc += x
    return acc


def test_add_repeated_on_values_outside_the_shortcut():
    for acc, x, k in [(math.inf, 1.0, 3), (1.0, math.inf, 2), (-0.0, 0.0, 1), (-0.0, 0.0, 0),
                      (2.0 ** 53, 1.0, 2), (2.0 ** 53 - 2, 1.0, 4), (0.5, 2.0, 3), (3.0, 0.25, 5)]:
        assert repr(add_repeated(acc, x, k)) == repr(_loop(acc, x, k))
    assert math.isnan(add_repeated(math.nan, 1.0, 2))
