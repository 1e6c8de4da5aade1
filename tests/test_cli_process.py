"""The command line's process settings (``tokenfair/cli/__init__.py``): numpy's BLAS runs one
thread unless the user set ``OPENBLAS_NUM_THREADS``."""

import os
import subprocess
import sys

import pytest

PROBE = ("import os, tokenfair.cli.app, numpy; "
         "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")


def _probe(env_value: str | None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    value, threads = out.stdout.split()
    return value, int(threads)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_blas_is_single_threaded_by_default():
    value, threads = _probe(None)
    assert value == "1"
    assert threads == 1          # numpy imported, no BLAS worker threads started


def test_a_value_the_user_set_is_kept():
    assert _probe("2")[0] == "2"
