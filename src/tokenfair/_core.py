"""The simulator's core modules that ``setup.py`` compiles with mypyc (the build's list).

Every module listed is ordinary, fully annotated Python: compiled, the same code runs as C;
interpreted, it runs as Python.  Results are identical either way
(``tests/test_compiled_core.py``).  Which of the two this process runs, and why, is
:mod:`tokenfair.core_build`'s business.  This file is plain Python and imports nothing of the
package (``setup.py`` runs it on its own).
"""

from __future__ import annotations

import os

COMPILED_MODULES = (
    "tokenfair.core.request", "tokenfair.core.name_counts", "tokenfair.core.kv", "tokenfair.runtime.loop",
    "tokenfair.runtime.recorder", "tokenfair.runtime.step_counter",
    "tokenfair.runtime.intake", "tokenfair.core.exactfloat", "tokenfair.core.stepcost",
    "tokenfair.sched.interface", "tokenfair.sched.policy", "tokenfair.sched.predictor",
    "tokenfair.sched.state", "tokenfair.sched.apply", "tokenfair.sched.admit",
    "tokenfair.sched.bulk", "tokenfair.sched.decode", "tokenfair.sched.running_pass", "tokenfair.sched.arrival",
    "tokenfair.sched.scheduler", "tokenfair.sched.baselines.fifo",
    "tokenfair.sched.baselines.classic", "tokenfair.sched.baselines.vtc",
    "tokenfair.sched.fair.tenant", "tokenfair.sched.fair.ordering",
    "tokenfair.sched.fair.review", "tokenfair.sched.fair.arrivals",
    "tokenfair.sched.fair.wfq", "tokenfair.sched.fair.admission", "tokenfair.sched.fair.preemption",
    "tokenfair.sched.fair.urgency", "tokenfair.sched.fair.accounting", "tokenfair.sched.fair.batching",
    "tokenfair.sched.fair.shares", "tokenfair.sched.fair.policy", "tokenfair.sched.fair.tpot",
    "tokenfair.sched.fair.forecast", "tokenfair.sched.fair.guarantee", "tokenfair.sched.fair.picking",
    "tokenfair.sched.fair.costs", "tokenfair.sched.fair.steptime", "tokenfair.sched.fair.roster",
    "tokenfair.sched.fair.headroom", "tokenfair.sched.fair.queue", "tokenfair.sched.fair.shaping",
    "tokenfair.sched.fair.background",
    "tokenfair.sim.engine", "tokenfair.sim.fastforward", "tokenfair.sim.simulate",
    "tokenfair.sim.replica", "tokenfair.sim.fleet_loop",
)

# what a build leaves beside this file: which modules it compiled, from which sources (sha256)
BUILD_MANIFEST = "core_build.json"


def source_files() -> list[str]:
    """The listed modules as paths relative to the project root (for setup.py)."""
    return [os.path.join("src", *m.split(".")) + ".py" for m in COMPILED_MODULES]
