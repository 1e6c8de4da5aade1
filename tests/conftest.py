"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenfair.workloads.traces import find_traces_dir
from tokenfair.workloads.workload import WorkloadError


@pytest.fixture(scope="session")
def public_traces() -> Path:
    """The public traces folder (``$TOKENFAIR_TRACES`` or ``shared/traces`` beside the
    checkout); the test is skipped, with that reason, where they are not on the machine."""
    try:
        return find_traces_dir()
    except WorkloadError:
        pytest.skip("public traces (shared/traces) not available")
