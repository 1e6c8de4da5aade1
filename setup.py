"""Builds the simulator's core with mypyc when it can: the modules ``src/tokenfair/_core.py``
lists become C extensions beside their ``.py`` files.  ``TOKENFAIR_PURE=1`` (or no mypyc,
or a failed C build: the extensions are optional) installs the same code interpreted."""

import os
import runpy
import sys

from setuptools import setup


def ext_modules():
    if os.environ.get("TOKENFAIR_PURE"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("tokenfair: mypyc is not available; the core stays interpreted", file=sys.stderr)
        return []
    core = runpy.run_path(os.path.join("src", "tokenfair", "_core.py"))
    exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent"] + core["source_files"](),
                    opt_level="3")
    for ext in exts:
        ext.optional = True         # no C compiler: install anyway, interpreted
    return exts


setup(ext_modules=ext_modules())
