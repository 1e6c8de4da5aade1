"""The shedding forecast counts the tenant's own higher-priority traffic (fair/forecast.py):
a request waits behind what is queued ahead of it *and* behind its tenant's later arrivals
in classes of a higher priority, which take part of the tenant's drain first."""

import numpy as np

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.sched.fair.tenant import TenantState
from tokenfair.sim.simulate import simulate_once
from tokenfair.workloads.scenarios import build_scenario

CLASSES = parse_contract({"classes": {"realtime": {"priority": 30}, "interactive": {"priority": 20},
                                      "batch": {"priority": 0}}}).classes


def test_admissions_are_kept_per_class_and_decay_together():
    t = TenantState("t", parse_contract({}).default_tenant, 0.0, held={})
    t.add_admitted("interactive", 900.0, 0.0, 10.0)
    t.add_admitted("realtime", 100.0, 0.0, 10.0)
    t.add_admitted("batch", 50.0, 5.0, 10.0)          # decays what was there to t = 5
    assert abs(t.admitted - sum(t.admitted_by_class.values())) < 1e-9
    decayed = np.exp(-0.5)
    assert abs(t.admitted_above(20, CLASSES) - 100.0 * decayed) < 1e-9      # realtime only
    assert abs(t.admitted_above(0, CLASSES) - 1000.0 * decayed) < 1e-9      # all but batch
    assert t.admitted_above(30, CLASSES) == 0.0


def test_flood_interactive_forecast_is_not_short_of_the_wait():
    """``flood``: the front end's realtime requests overtake its interactive flood.  Before,
    the interactive forecasts were 7% short (median forecast / wait 0.93) and 797 of the
    2,688 admitted started past their max wait."""
    workload, contract = build_scenario("flood", 0)
    run = simulate_once(workload, "fair", contract, load_profile(None))
    rows = np.array([(r.predicted_wait_s, r.scheduled_s - r.arrival_s, r.max_wait_s) for r in run.requests
                     if r.tenant == "frontend" and r.klass == "interactive" and r.scheduled_s is not None
                     and r.predicted_wait_s is not None])
    waited = rows[:, 1] > 1.0
    ratio = float(np.median(rows[waited, 0] / rows[waited, 1]))
    assert 0.98 <= ratio <= 1.1
    assert int((rows[:, 1] > rows[:, 2]).sum()) < 0.15 * len(rows)          # 263 of 2,626
