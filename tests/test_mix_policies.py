"""``scripts/mix_policies.py``: what each policy spends beside in-time goodput on one mix."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "mix_policies.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def _figures(line: str) -> dict[str, float]:
    """A policy line's in-time goodput, light tenants' in-time and asked tokens (M)."""
    m = re.search(r"in-time goodput ([0-9.]+) M tokens; light tenants in time ([0-9.]+) of ([0-9.]+) M", line)
    assert m, line
    return {"in_time": float(m[1]), "light": float(m[2]), "asked": float(m[3])}


def test_fifo_buys_its_goodput_on_mix_211_with_the_light_tenants_service():
    """Mix 211: fifo's in-time goodput is above fair's, and its light tenant gets a fraction
    of its tokens in time where fair serves them all; the interactive class's P99 TPOT is
    shown against its SLO for every policy."""
    p = _run("--seed", "211")
    assert p.returncode == 0, p.stderr
    head, *lines = p.stdout.strip().splitlines()
    assert head.startswith("random-mix-211: 1313 requests; light tenants: s0")
    rows = {line.split(":")[0]: line for line in lines}
    assert sorted(rows) == ["fair", "fifo", "vtc"]
    fair, fifo = _figures(rows["fair"]), _figures(rows["fifo"])
    assert fifo["in_time"] > fair["in_time"]
    assert fair["asked"] == fifo["asked"] > 0
    assert fair["light"] == fair["asked"]                 # every light token in time under fair
    assert fifo["light"] < 0.1 * fair["light"]
    for line in rows.values():
        assert re.search(r"interactive [0-9.]+ s \(SLO 0\.2\)", line), line


def test_a_scenario_names_the_acceptance_light_tenants():
    p = _run("--seed", "0", "--scenario", "burst-long")
    assert p.returncode == 0, p.stderr
    head, *lines = p.stdout.strip().splitlines()
    assert "light tenants: stream-0, stream-1" in head
    vtc = next(line for line in lines if line.startswith("vtc:"))
    tpot = float(re.search(r"interactive ([0-9.]+) s \(SLO 0\.1\)", vtc)[1])
    assert tpot > 0.1                                     # vtc's streams miss their TPOT SLO


def test_bad_arguments_exit_2():
    for args in (["--seed", "-1"], ["--seed", "x"], [], ["--seed", "0", "--scenario", "nope"]):
        p = _run(*args)
        assert p.returncode == 2 and "error" in p.stderr, (args, p.stderr)
    p = _run("--seed", "0", "--profile", "nosuch")
    assert p.returncode == 2 and "profile 'nosuch'" in p.stderr and "Traceback" not in p.stderr, p.stderr
