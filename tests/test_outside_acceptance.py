"""``scripts/outside_acceptance.py`` (and ``scripts/acceptance.py``'s arguments): the mixes'
lines and summary, the same in worker processes as in one, bad arguments exit 2."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=300)


def test_workers_print_what_one_process_prints_with_the_summary():
    one = _run("outside_acceptance.py", "--seeds", "0-3")
    two = _run("outside_acceptance.py", "--seeds", "0-3", "--jobs", "2")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    assert one.stdout == two.stdout
    lines = one.stdout.splitlines()
    mixes = [line for line in lines if line.startswith("mix ")]
    assert [int(line.split()[1].rstrip(":")) for line in mixes] == [0, 1, 2, 3]
    figures = [re.search(r"fair ([0-9.]+) fifo ([0-9.]+) vtc ([0-9.]+); shed (\d+)", line) for line in mixes]
    assert all(figures), mixes
    sums = re.search(r"summed over the mixes, M tokens: fair ([0-9.]+), fifo ([0-9.]+), vtc ([0-9.]+)", lines[-1])
    assert sums, lines[-1]
    for k in (1, 2, 3):                         # each line's figure is rounded to 0.005
        assert abs(float(sums[k]) - sum(float(m[k]) for m in figures)) <= 0.005 * len(mixes) + 1e-9
    num_shed = sum(int(m[4]) > 0 for m in figures)
    num_above = sum(float(m[1]) > max(float(m[2]), float(m[3])) for m in figures)
    assert f"fair sheds on {num_shed} of the 4 mixes" in lines[-2]
    # a tie in the printed figures may hide a difference in the exact ones
    above = int(re.search(r"above the best baseline's on (\d+)", lines[-2])[1])
    assert num_above <= above <= num_above + sum(float(m[1]) == max(float(m[2]), float(m[3])) for m in figures)


def test_bad_arguments_exit_2():
    for args in (["--jobs", "0"], ["--jobs", "x"], ["--seeds", "x"], ["--seeds", "5-2"]):
        p = _run("outside_acceptance.py", *args)
        assert p.returncode == 2 and args[0] in p.stderr, (args, p.stderr)
    for script, args in (("outside_acceptance.py", ["--seeds", "0"]), ("acceptance.py", ["--seed", "0"])):
        p = _run(script, *args, "--profile", "nosuch")
        assert p.returncode == 2 and "profile 'nosuch'" in p.stderr and "Traceback" not in p.stderr, p.stderr
