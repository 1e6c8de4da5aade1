"""``scripts/shed_misses.py``: which shed requests the engine would have served in time."""

import subprocess
import sys
from pathlib import Path

import pytest

from tokenfair.core.costmodel import load_profile
from tokenfair.sched.fair.forecast import SHED_DOUBT_FACTOR
from tokenfair.workloads.random_mix import random_mix

from module_file import load_module_file

SCRIPT = Path(__file__).parent.parent / "scripts" / "shed_misses.py"


def _script():
    return load_module_file(SCRIPT, "shed_misses")


def test_a_wrongly_shed_request_is_put_in_one_kind():
    sm = _script()
    # Shed(arrival, shed at, forecast, limit, unshed wait, max wait, late); the last arrival at 350 s
    assert sm.kind_of(sm.Shed(100.0, 100.0, 900.0, 300.0, 250.0, 300.0, False), 350.0) == "arrivals end"  # 100 + 300 > 350
    assert sm.kind_of(sm.Shed(100.0, 100.0, 36.0, 30.0, 25.0, 30.0, False), 350.0) == "just over"  # 36 <= 1.25 x 30
    assert sm.kind_of(sm.Shed(100.0, 100.0, 40.0, 30.0, 25.0, 30.0, False), 350.0) == "well over"
    # reviewed in the queue at 340 s, before the last arrival: the forecast is of the rest of
    # the wait, against the minute left; reviewed at 360 s, after it
    assert sm.kind_of(sm.Shed(100.0, 340.0, 70.0, 60.0, 290.0, 300.0, False), 350.0) == "arrivals end"
    assert sm.kind_of(sm.Shed(120.0, 360.0, 70.0, 60.0, 290.0, 300.0, False), 350.0) == "just over"


def test_the_forecast_is_read_from_a_real_shedding_reason():
    sm = _script()
    wl, contract, _ = random_mix(163)
    num_shed, num_late, groups = sm.shed_groups(wl, contract, load_profile(None))
    entries = [x for xs in groups.values() for x in xs]
    assert num_shed == len(entries) > 0 and 0 <= num_late <= num_shed
    margin = contract.admission.shed_margin
    kinds = set()
    for arrival, shed_at, forecast, limit, unshed_wait, max_wait, late in entries:
        where = sm.where_of(sm.Shed(arrival, shed_at, forecast, limit, unshed_wait, max_wait, late))
        kinds.add(where)
        if shed_at == arrival:                              # at arrival (30-60 s classes)
            assert where == "at arrival"
            assert limit == round(margin * max_wait, 1) and forecast > SHED_DOUBT_FACTOR * limit
        else:                                               # at a review, against what was left
            assert where == "at review"
            assert arrival < shed_at < arrival + max_wait and forecast > limit
            assert abs(limit - margin * (arrival + max_wait - shed_at)) <= 0.05 + 1e-9
        # waited past its max wait unshed exactly when its unshed wait says so
        assert late == (unshed_wait is None or unshed_wait > max_wait)
    assert kinds == {"at arrival", "at review"}
    with pytest.raises(ValueError, match="no forecast"):
        sm.forecast_of("queue full")
    assert sm.forecast_of("overloaded: queued 240s: predicted wait 75.2s more exceeds 60.0s (class 'batch' "
                          "max_wait_s 300.0); retry after ~15s") == (75.2, 60.0)


def test_the_script_refuses_bad_arguments_with_exit_2():
    for args in (["--seeds", "5-2"], ["--seeds", "x"], ["--scenario", "nope"]):
        res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert res.returncode == 2 and args[0] in res.stderr, (args, res.stderr)
    res = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--profile", "nosuch"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "profile 'nosuch'" in res.stderr and "Traceback" not in res.stderr, res.stderr
