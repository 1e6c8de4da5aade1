"""The simulator's core modules that ``setup.py`` compiles with mypyc, and their state here.

Every module listed is ordinary, fully annotated Python: compiled, the same code runs as C
(attribute access on the scheduler's classes and calls between them stop going through the
interpreter); without a compiler, or with ``TOKENFAIR_PURE=1`` at install time, it runs
interpreted.  Results are identical either way (``tests/test_compiled_core.py``).

A compiled module is an extension file beside its ``.py``; Python imports the extension
first, so an edited ``.py`` does nothing until ``make compile`` (or ``make pure``, which
removes the extensions).  ``stale_modules`` names such modules; ``tokenfair`` warns about
them on import.  This file itself is plain Python and imports nothing of the package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

COMPILED_MODULES = (
    "tokenfair.request", "tokenfair.kv", "tokenfair.loop", "tokenfair.recorder",
    "tokenfair.intake", "tokenfair.exactfloat", "tokenfair.stepcost",
    "tokenfair.sched.interface", "tokenfair.sched.policy", "tokenfair.sched.predictor",
    "tokenfair.sched.state", "tokenfair.sched.apply", "tokenfair.sched.admit",
    "tokenfair.sched.bulk", "tokenfair.sched.scheduler", "tokenfair.sched.fifo",
    "tokenfair.sched.baselines", "tokenfair.sched.vtc",
    "tokenfair.sched.fair.state", "tokenfair.sched.fair.tenant", "tokenfair.sched.fair.ordering",
    "tokenfair.sched.fair.wfq", "tokenfair.sched.fair.admission", "tokenfair.sched.fair.preemption",
    "tokenfair.sched.fair.urgency", "tokenfair.sched.fair.accounting", "tokenfair.sched.fair.batching",
    "tokenfair.sched.fair.shares", "tokenfair.sched.fair.policy", "tokenfair.sched.fair.tpot",
    "tokenfair.sched.fair.forecast", "tokenfair.sched.fair.guarantee", "tokenfair.sched.fair.picking",
    "tokenfair.sim.engine", "tokenfair.sim.fastforward", "tokenfair.sim.simulate",
)

_PACKAGE_DIR = Path(__file__).resolve().parent


def _paths(module: str) -> tuple[Path, list[Path]]:
    """(the module's .py, the extension files built for it)."""
    rel = Path(*module.split(".")[1:])
    folder = _PACKAGE_DIR / rel.parent
    return (_PACKAGE_DIR / rel).with_suffix(".py"), sorted(folder.glob(rel.name + ".*.so"))


def compiled_modules() -> list[str]:
    """The listed modules that have an extension built beside them (what Python imports)."""
    return [m for m in COMPILED_MODULES if _paths(m)[1]]


def stale_modules() -> list[str]:
    """Compiled modules whose ``.py`` changed after the extension was built.  A module's
    extension is a thin shim (a rebuild may keep an old one) over the group's shared library
    beside the package, which every build rewrites: the newer of the two counts."""
    libs = [lib.stat().st_mtime for lib in _PACKAGE_DIR.parent.glob("*__mypyc.*.so")]
    stale = []
    for m in COMPILED_MODULES:
        source, exts = _paths(m)
        if exts and source.exists():
            built = max([e.stat().st_mtime for e in exts] + libs)
            if source.stat().st_mtime > built:
                stale.append(m)
    return stale


def core_kind() -> str:
    """"mypyc" when the scheduler core imported from extensions, else "python"."""
    spec = importlib.util.find_spec("tokenfair.sched.scheduler")
    origin = spec.origin if spec is not None else None
    return "mypyc" if origin and not origin.endswith(".py") else "python"


def source_files() -> list[str]:
    """The listed modules as paths relative to the project root (for setup.py)."""
    return [os.path.join("src", *m.split(".")) + ".py" for m in COMPILED_MODULES]
