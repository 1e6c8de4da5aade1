"""A tenant passed over by the light preference is forced within ``FORCE_AFTER_S``
(sched/fair/guarantee.py): thirty small tenants and a whale start together on a saturated
engine; the tenants whose first prompt is larger than the others' are not light, and with
a 5 s grace one of them waited 2.9 s for a round of the light tenants (vtc: 0.87 s)."""

import numpy as np

from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import BACKLOG_GRACE_S
from tokenfair.sched.fair.guarantee import FORCE_AFTER_S
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.scenarios import SCENARIOS, poisson_stream, scenario_contract
from tokenfair.workloads.workload import TraceRow, Workload

NUM_LIGHT = 30
DURATION_S = 20.0


def _workload() -> Workload:
    """``many-light`` (seed 0) with thirty light tenants instead of twenty, its first 20 s."""
    rng = np.random.default_rng([0, SCENARIOS.index("many-light")])
    items = poisson_stream(rng, "whale", 1.0, 0, 240.0, (2000, 0.5, 128, 8000), (400, 0.5, 16, 1500))
    for k in range(NUM_LIGHT):
        items += poisson_stream(rng, f"light-{k:02d}", 0.5, 0, 240.0, (1500, 0.4, 64, 6000), (250, 0.4, 8, 1000))
    items = sorted(x for x in items if x[0] < DURATION_S)
    return Workload("thirty-light", tuple(TraceRow(f"r{i}", round(t, 6), ten, p, o)
                                          for i, (t, ten, p, o, _) in enumerate(items)))


def test_every_backlogged_tenant_is_served_within_the_forcing_grace_at_a_saturated_start():
    out = simulate(_workload(), "fair", scenario_contract("many-light"), load_profile(None), isolated=False)
    s = out.summary
    assert s["starvation_events"] == 0
    # a forced head is admitted within a few steps of its grace (slots and KV are free here)
    assert s["longest_service_gap_s"] <= FORCE_AFTER_S + 0.2, s["longest_service_gap_s"]
    assert FORCE_AFTER_S + 0.2 < BACKLOG_GRACE_S     # under the grace within which no one counts as backlogged
    assert {r["status"] for r in out.records} <= {"finished", "rejected"}
