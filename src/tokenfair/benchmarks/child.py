"""The child process of a benchmark (``python -m tokenfair.benchmarks.child SPEC``): one
simulation or fleet simulation in a fresh process, so its peak RSS and wall time are its own.
Prints one JSON line; a user error (a bad workload or option) prints ``error: ...`` and exits
with status 2 (``bench.USER_ERROR_STATUS``), which the parent reports without a traceback."""

from __future__ import annotations

import json
import sys

from .. import cli  # noqa: F401  (the command line's process settings, before numpy loads)


def main(spec: dict) -> dict:
    if spec.get("kind") == "fleet":
        from .fleet_sim import fleet_child
        return fleet_child(spec)
    from .bench import sim_child
    return sim_child(spec)


if __name__ == "__main__":
    from ..cli.common import USER_ERRORS
    from .bench import USER_ERROR_STATUS
    try:
        result = main(json.loads(sys.argv[1]))
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_STATUS)
    print(json.dumps(result))
