"""``scripts/calm_tails.py``: fair's per-tenant P99 TTFT against fifo's and vtc's where
nothing is overloaded, and how much of a tail the slot headroom holds."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "calm_tails.py"
LINE = re.compile(r"mix (\d+): (\S+)( \(light\))? P99 TTFT ([0-9.]+) s, ([0-9.]+)x the better baseline's "
                  r"([0-9.]+) s; (\d+) late requests, (\d+) of them held mostly by the slot headroom")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def _tails(stdout: str) -> dict[tuple[int, str], tuple[float, int, int]]:
    """(mix, tenant) -> (ratio, late requests, held by the headroom) of each flagged line."""
    out = {}
    for m in LINE.finditer(stdout):
        out[(int(m[1]), m[2])] = (float(m[5]), int(m[7]), int(m[8]))
    return out


def test_the_slot_headroom_holds_a_tenant_past_its_slot_share_on_a_calm_mix():
    """Mix 5 is calm (every request finished within its max wait under each policy), and
    fair's P99 for s5 is several times the better baseline's: most of its late requests
    waited while a slot was free, held by the slots kept for the tenants within their share."""
    p = _run("--seeds", "5")
    assert p.returncode == 0, p.stderr
    assert "1 of 1 mixes calm; 7 tenants in them" in p.stdout
    tails = _tails(p.stdout)
    ratio, late, held = tails[(5, "s5")]
    assert ratio > 3 and late > 10 and held > late / 2
    assert all(r > 1.2 for r, _, _ in tails.values())


def test_a_tail_from_order_is_not_put_on_the_headroom():
    """Mix 45 is calm too, and none of its flagged tenants' late requests waited mostly
    held by the headroom: the script does not put every tail on it."""
    p = _run("--seeds", "45")
    assert p.returncode == 0, p.stderr
    tails = _tails(p.stdout)
    assert tails and all(held == 0 < late for _, late, held in tails.values())


def test_an_overloaded_mix_is_not_calm():
    p = _run("--seeds", "39")
    assert p.returncode == 0, p.stderr
    assert "0 of 1 mixes calm; 0 tenants in them" in p.stdout and not _tails(p.stdout)


def test_bad_arguments_exit_2():
    for args in (["--seeds", "x"], ["--ratio", "0"], ["--min-s", "-1"], ["--jobs", "0"]):
        p = _run(*args)
        assert p.returncode == 2 and "error" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
