"""The fault-injecting soak at a small size: every fault kind happens, every request ends
exactly once with a reason, the KV/slot invariants hold after every step, nothing is held
after the run (the soak asserts those as it runs)."""

from __future__ import annotations

import random

import pytest

from tokenfair.benchmarks.soak import FaultyEngine, SoakConfig, run_soak


def test_small_soak_every_request_one_terminal_state():
    rep = run_soak(SoakConfig(num_requests=1500, seed=3, p_poison=0.01, p_step_failure=0.002, p_cancel=0.03,
                              p_bad_class=0.05))
    assert sum(rep.by_status.values()) == 1500
    assert rep.num_invariant_checks == rep.num_steps > 1000
    for code in ("invalid_row", "request_fault", "engine_error", "client_disconnected", "class_not_allowed"):
        assert rep.by_code[code] > 0, (code, rep.by_code)
    assert rep.by_status["finished"] > 0.6 * 1500
    assert rep.max_live < 200                 # what is held is what is in the system, not what was seen


def test_soak_is_deterministic():
    a = run_soak(SoakConfig(num_requests=300, seed=5)).as_dict()
    b = run_soak(SoakConfig(num_requests=300, seed=5)).as_dict()
    for key in ("wall_s", "peak_rss_mb"):
        a.pop(key), b.pop(key)
    assert a == b


def test_a_double_end_is_caught():
    from tokenfair.benchmarks.soak import _Soak
    from tokenfair.core.request import Status

    from tokenfair.core.reasons import Reason, ReasonCode

    s = _Soak(SoakConfig(num_requests=3))
    s.end(0, Status.FAILED, Reason(ReasonCode.ENGINE_ERROR, "y"))
    with pytest.raises(AssertionError, match="ended twice"):
        s.end(0, Status.FAILED, Reason(ReasonCode.ENGINE_ERROR, "y"))
    with pytest.raises(AssertionError, match="without a reason"):
        s.end(1, Status.FAILED, None)


def test_poisoned_request_fails_alone():
    from tokenfair.core.costmodel import load_profile
    from tokenfair.core.request import Request
    from tokenfair.sched.interface import SchedulerOutput
    from tokenfair.sim.engine import SimEngine

    sim = SimEngine(load_profile("vtc-a10g-llama2-7b"))
    reqs = [Request(f"r{i}", i, "t", "interactive", 0.0, 10, 50) for i in range(5)]
    for r in reqs:
        sim.add(r, 20)
    eng = FaultyEngine(sim, random.Random(0), p_poison=1.0, p_step_failure=0.0)
    out = SchedulerOutput()
    out.prefill.extend((r, 10) for r in reqs)
    res = eng.execute(out)
    assert len(res.failed) == 1 and res.failed[0][1].code.value == "request_fault"
    assert len(sim.true_lengths) == 4
