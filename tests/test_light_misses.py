"""``scripts/light_misses.py``: where a light tenant's late first tokens come from."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenfair.core.costmodel import load_profile
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.random_mix import random_mix

from module_file import load_module_file

SCRIPT = Path(__file__).parent.parent / "scripts" / "light_misses.py"


def _script():
    return load_module_file(SCRIPT, "light_misses")


def _req(arrival_s, scheduled_s, first_token_s, prompt_tokens):
    return SimpleNamespace(arrival_s=arrival_s, scheduled_s=scheduled_s, first_token_s=first_token_s,
                           prompt_tokens=prompt_tokens)


def _step(start, running=1, max_running=8, prefill=0, usage=0.1):
    return (start, running, max_running, prefill, usage)


def test_the_largest_part_names_a_late_request():
    lm = _script()
    steps = [_step(0.0), _step(1.0), _step(1.1), _step(1.2), _step(1.3)]
    starts = [s[0] for s in steps]
    rec = _req(0.05, 1.0, 1.1, 100)
    assert lm.part_of(rec, steps, starts, 1024) == "step in flight"      # 0.95 s of the step at 0
    full = [_step(0.0), _step(0.1, running=8), _step(0.2, running=8), _step(0.9), _step(1.0)]
    rec = _req(0.05, 0.9, 1.0, 100)
    assert lm.part_of(rec, full, [s[0] for s in full], 1024) == "slots full"
    busy = [_step(0.0), _step(0.1, prefill=900), _step(0.2, prefill=900), _step(0.9), _step(1.0)]
    assert lm.part_of(rec, busy, [s[0] for s in busy], 1024) == "prefill budget"
    idle = [_step(0.0), _step(0.1), _step(0.2), _step(0.9), _step(1.0)]
    assert lm.part_of(rec, idle, [s[0] for s in idle], 1024) == "order"
    rec = _req(0.0, 0.1, 1.0, 100)
    idle_starts = [s[0] for s in idle]
    assert lm.part_of(rec, idle, idle_starts, 1024) == "prefill split"      # 3 steps, 1 alone
    rec.prompt_tokens = 3000
    assert lm.part_of(rec, idle, idle_starts, 1024) == "prefill as alone"   # 3 steps, 3 alone
    rec = _req(0.05, 0.1, 0.2, 100)
    assert lm.part_of(rec, idle, idle_starts, 1024) == "prefill step"


def test_water_filling_gives_the_small_what_it_asks():
    lm = _script()
    assert lm.water_level({"a": 10.0, "b": 100.0}, {"a": 1.0, "b": 1.0}, 60.0) == pytest.approx(50.0)
    assert lm.water_level({"a": 100.0, "b": 100.0}, {"a": 1.0, "b": 3.0}, 80.0) == pytest.approx(20.0)
    assert lm.water_level({"a": 10.0, "b": 100.0}, {"a": 1.0, "b": 1.0}, 200.0) == float("inf")


def test_a_mix_without_overload_is_split_into_its_parts():
    lm = _script()
    wl, contract, light = random_mix(14)
    profile = load_profile(None)
    found = lm.misses(wl, contract, light, profile, 20.0)
    assert [f[0] for f in found] == ["s4"]
    tenant, ratio, over, parts = found[0]
    assert ratio > 2 and not over                   # 11.2x, within its share
    out = simulate(wl, "fair", contract, profile, isolated=True)
    bound = 2 * out.summary["tenants"]["s4"]["isolated"]["ttft_s"]["p99"]
    late = [r for r in out.records if r["tenant"] == "s4" and r["first_token_s"] is not None
            and r["first_token_s"] - r["arrival_s"] > bound]
    assert sum(parts.values()) == len(late) > 0
    assert parts["order"] < len(late) / 4            # the steps' make-up, not fair's order


def test_the_script_refuses_bad_arguments_with_exit_2():
    for args in (["--seeds", "5-2"], ["--seeds", "x"], ["--scenario", "nope"]):
        res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert res.returncode == 2 and args[0] in res.stderr, (args, res.stderr)
    res = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--profile", "nosuch"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "profile 'nosuch'" in res.stderr and "Traceback" not in res.stderr, res.stderr
