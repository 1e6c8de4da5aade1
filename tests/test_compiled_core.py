"""The mypyc-compiled core gives exactly the interpreted core's results.

``setup.py`` compiles the modules ``tokenfair._core.COMPILED_MODULES`` lists; these tests run
the same simulations with the compiled modules (this process) and with the plain ``.py``
files (a subprocess importing a copy of the package without the extensions) and compare a
hash of every request record, the whole timeline and the scheduler's counters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tokenfair
from tokenfair._core import COMPILED_MODULES, compiled_modules, core_kind, stale_modules

_FINGERPRINT = r'''
import hashlib, json, sys
from tokenfair.costmodel import load_profile
from tokenfair.metrics import request_record
from tokenfair.scenarios import build_scenario
from tokenfair.sim.simulate import simulate_once
from tokenfair._core import core_kind
out = {"core": core_kind()}
for scenario in ("hol", "burst"):
    wl, contract = build_scenario(scenario, 0)
    for policy in ("fifo", "sjf", "priority", "vtc", "fair"):
        for fast in (True, False):
            res = simulate_once(wl, policy, contract, load_profile(None), fast=fast)
            recs = json.dumps([request_record(r) for r in res.requests], sort_keys=True)
            timeline = json.dumps(res.recorder.to_json(), sort_keys=True)
            s = res.scheduler
            out[f"{scenario}/{policy}/{fast}"] = [
                hashlib.sha256(recs.encode()).hexdigest(), hashlib.sha256(timeline.encode()).hexdigest(),
                repr(res.end_s), s.num_preemptions, s.num_recomputed_tokens, s.num_swapped_blocks, s.num_steps]
print(json.dumps(out))
'''


def _fingerprints(pythonpath: str | None) -> dict:
    env = None
    if pythonpath is not None:
        import os
        env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-c", _FINGERPRINT], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout)


requires_compiled = pytest.mark.skipif(
    not compiled_modules(), reason="the core is not compiled here (no mypyc build: TOKENFAIR_PURE or no compiler)")


@requires_compiled
def test_every_listed_module_is_compiled_and_current():
    assert compiled_modules() == list(COMPILED_MODULES)
    assert core_kind() == "mypyc"
    assert stale_modules() == []


@pytest.mark.slow
@requires_compiled
def test_compiled_core_gives_the_interpreted_results_exactly(tmp_path):
    pure = tmp_path / "pure"
    shutil.copytree(Path(tokenfair.__file__).parent, pure / "tokenfair",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    compiled = _fingerprints(None)
    interpreted = _fingerprints(str(pure))
    assert compiled.pop("core") == "mypyc" and interpreted.pop("core") == "python"
    assert len(compiled) == 20
    assert compiled == interpreted


def test_stale_modules_sees_an_edited_source(tmp_path, monkeypatch):
    import tokenfair._core as core
    pkg = tmp_path / "tokenfair"
    (pkg / "sched").mkdir(parents=True)
    source = pkg / "sched" / "fifo.py"
    ext = pkg / "sched" / "fifo.cpython-311-x86_64-linux-gnu.so"
    source.write_text("x = 1\n")
    ext.write_bytes(b"")
    monkeypatch.setattr(core, "_PACKAGE_DIR", pkg)
    import os
    os.utime(source, (1_000, 1_000))
    os.utime(ext, (2_000, 2_000))
    assert core.compiled_modules() == ["tokenfair.sched.fifo"] and core.stale_modules() == []
    os.utime(source, (3_000, 3_000))
    assert core.stale_modules() == ["tokenfair.sched.fifo"]
    shared = tmp_path / "abc__mypyc.cpython-311-x86_64-linux-gnu.so"   # the group's code, rebuilt
    shared.write_bytes(b"")
    os.utime(shared, (4_000, 4_000))
    assert core.stale_modules() == []
