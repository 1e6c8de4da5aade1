"""Random tenant mixes with random contracts (``workloads/random_mix.py``): workloads outside
the built-in scenarios, for ``scripts/outside_acceptance.py``."""

from tokenfair.workloads.random_mix import random_mix


def test_a_mix_is_the_same_for_a_seed_and_valid():
    wl, contract, light = random_mix(16)
    again, contract2, light2 = random_mix(16)
    assert wl.rows == again.rows and contract == contract2 and light == light2
    assert [r.arrival_s for r in wl.rows] == sorted(r.arrival_s for r in wl.rows)
    assert {r.tenant for r in wl.rows} == set(contract.tenants)
    assert "burst" in contract.tenants and contract.classes["batch"].max_wait_s == 600
    assert light and set(light) < set(contract.tenants)
    assert random_mix(17)[0].rows != wl.rows
