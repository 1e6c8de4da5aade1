"""The mypyc-compiled core gives exactly the interpreted core's results.

``setup.py`` compiles the modules ``tokenfair._core.COMPILED_MODULES`` lists; these tests run
the same simulations with the compiled modules and with the plain ``.py`` files (a subprocess
with ``TOKENFAIR_PURE=1``) and compare a hash of every request record, the whole timeline and
the scheduler's counters.  ``tokenfair.core_build`` decides which core runs; its rules are
tested here on fake builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tokenfair
from tokenfair import core_build
from tokenfair._core import BUILD_MANIFEST, COMPILED_MODULES
from tokenfair.core_build import compiled_modules, core_kind, stale_modules

_FINGERPRINT = r'''
import hashlib, json, sys
from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import request_record
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.sim.simulate import simulate_once
from tokenfair.core_build import core_kind
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


def _fingerprints(pure: bool) -> dict:
    env = dict(os.environ, TOKENFAIR_PURE="1" if pure else "")
    proc = subprocess.run([sys.executable, "-c", _FINGERPRINT], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout)


requires_compiled = pytest.mark.skipif(
    core_kind() != "mypyc", reason=f"the compiled core does not run here: {core_build.describe()}")


@pytest.mark.skipif(not os.environ.get("TOKENFAIR_REQUIRE_COMPILED"),
                    reason="TOKENFAIR_REQUIRE_COMPILED is not set (make test sets it)")
def test_make_test_runs_the_compiled_core():
    """`make test` must not pass quietly on an interpreted core (a failed or stale build)."""
    assert core_kind() == "mypyc", core_build.describe()


@requires_compiled
def test_every_listed_module_is_compiled_and_current():
    assert compiled_modules() == list(COMPILED_MODULES)
    assert core_kind() == "mypyc"
    assert stale_modules() == []


@pytest.mark.slow
@requires_compiled
def test_compiled_core_gives_the_interpreted_results_exactly():
    compiled = _fingerprints(pure=False)
    interpreted = _fingerprints(pure=True)
    assert compiled.pop("core") == "mypyc" and interpreted.pop("core") == "python"
    assert len(compiled) == 20
    assert compiled == interpreted


@requires_compiled
def test_a_compiled_class_cannot_be_patched():
    """A patched method of a native class would be ignored by compiled callers: it raises."""
    from tokenfair.sched.policy import Policy
    from tokenfair.sched.scheduler import IterationScheduler
    with pytest.raises(TypeError, match="immutable"):
        IterationScheduler.schedule = lambda self, now: None
    with pytest.raises(TypeError):
        setattr(Policy, "pick", None)

    class Mine(Policy):                   # plain-Python subclasses stay ordinary classes
        pass
    Mine.extra = 1
    assert Mine.extra == 1


@requires_compiled
def test_classes_imported_natively_by_another_compiled_module_are_sealed_too():
    """``tokenfair.runtime.loop`` imports the scheduler natively (no import hook runs for it)."""
    code = ("import tokenfair.runtime.loop\n"
            "from tokenfair.sched.scheduler import IterationScheduler\n"
            "try:\n    IterationScheduler.schedule = 1\nexcept TypeError:\n    print('sealed')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "sealed"


def test_pure_environment_imports_the_sources():
    code = ("import tokenfair, tokenfair.sched.scheduler as s, tokenfair.core_build as b; "
            "print(s.__file__, b.core_kind())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=dict(os.environ, TOKENFAIR_PURE="1"))
    path, kind = proc.stdout.split()
    assert path.endswith("scheduler.py") and kind == "python"
    assert "RuntimeWarning" not in proc.stderr


def test_version_names_the_core():
    proc = subprocess.run([sys.executable, "-m", "tokenfair.cli.app", "--version"], capture_output=True,
                          text=True, check=True)
    assert proc.stdout.startswith(f"tokenfair {tokenfair.__version__} core={core_kind()} (")


def _fake_build(tmp_path, monkeypatch, *, manifest: dict | None):
    """A package folder with one listed module, its extension and (optionally) a manifest."""
    pkg = tmp_path / "tokenfair"
    (pkg / "sched" / "baselines").mkdir(parents=True)
    source = pkg / "sched" / "baselines" / "fifo.py"
    source.write_text("x = 1\n")
    (pkg / "sched" / "baselines" / "fifo.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    if manifest is not None:
        (pkg / BUILD_MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(core_build, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(core_build, "COMPILED_MODULES", ("tokenfair.sched.baselines.fifo",))
    return source


def pkg_dir(source):
    return source.parent.parent.parent


def test_an_edited_source_makes_its_extension_stale(tmp_path, monkeypatch):
    source = _fake_build(tmp_path, monkeypatch, manifest=None)
    digest = core_build.source_digest(source)
    (pkg_dir(source) / BUILD_MANIFEST).write_text(json.dumps({"sources": {"tokenfair.sched.baselines.fifo": digest}}))
    assert core_build.compiled_modules() == ["tokenfair.sched.baselines.fifo"] and core_build.stale_modules() == []
    assert core_build.decide({}).kind == "mypyc"
    source.write_text("x = 2\n")                 # edited after the build: a newer mtime is not needed
    assert core_build.stale_modules() == ["tokenfair.sched.baselines.fifo"]
    status = core_build.decide({})
    assert status.kind == "python" and "make compile" in status.reason and status.stale == ("tokenfair.sched.baselines.fifo",)


def test_a_failed_build_or_no_manifest_runs_the_sources(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, manifest={"failed": "tokenfair.core.request: CompileError: gcc"})
    status = core_build.decide({})
    assert status.kind == "python" and "the compiled build failed: tokenfair.core.request" in status.reason
    (tmp_path / "tokenfair" / BUILD_MANIFEST).unlink()
    assert core_build.decide({}).kind == "python"          # extensions nobody vouches for
    assert core_build.decide({"TOKENFAIR_PURE": "1"}).reason == "TOKENFAIR_PURE=1"
