"""Builds the simulator's core with mypyc when it can: the modules ``src/tokenfair/_core.py``
lists become C extensions beside their ``.py`` files.  ``TOKENFAIR_PURE=1`` (or no mypyc, or
a failed C build: the extensions are optional, so the install goes on) installs the same code
interpreted.  Either way the build writes ``core_build.json`` beside the package's sources:
the sha256 of every source it compiled, or why it did not compile.  ``import tokenfair``
runs the extensions only when that manifest matches the sources (``tokenfair/core_build.py``),
and ``tokenfair --version`` says which core runs and why."""

import hashlib
import json
import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

CORE = runpy.run_path(os.path.join("src", "tokenfair", "_core.py"))
SOURCE_MANIFEST = os.path.join("src", "tokenfair", CORE["BUILD_MANIFEST"])


def write_manifest(path, **fields):
    with open(path, "w") as f:
        json.dump(fields, f, indent=1, sort_keys=True)


def report(message):
    print(f"tokenfair: {message}", file=sys.stderr)


def ext_modules():
    if os.environ.get("TOKENFAIR_PURE", "") not in ("", "0"):
        # nothing built, nothing recorded: extensions another install built from these sources
        # (same interpreter, e.g. .venv beside .venv-vllm) stay valid under their manifest
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        write_manifest(SOURCE_MANIFEST, failed="mypyc is not available")
        report("mypyc is not available; the core stays interpreted")
        return []
    try:
        exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent"] + CORE["source_files"](),
                        opt_level="3")
    except (Exception, SystemExit) as exc:          # mypy type errors end in SystemExit
        write_manifest(SOURCE_MANIFEST, failed=f"mypyc: {exc}")
        report(f"mypyc could not compile the core ({exc}); it stays interpreted")
        return []
    for ext in exts:
        ext.optional = True         # no C compiler: install anyway, interpreted (and say so)
    return exts


class CoreBuildExt(build_ext):
    """build_ext that records, beside the built package, what it compiled or why it failed."""

    def run(self):
        self.core_failures = []
        super().run()
        if not self.extensions:
            return
        folder = os.path.dirname(self.get_ext_fullpath("tokenfair._core_probe"))
        manifest = os.path.join(folder, CORE["BUILD_MANIFEST"])
        if self.core_failures:
            write_manifest(manifest, failed="; ".join(self.core_failures))
            report("the compiled core FAILED to build (" + "; ".join(self.core_failures)
                   + "); it installs interpreted, about 3-4x slower")
            return
        sources = {m: hashlib.sha256(open(p, "rb").read()).hexdigest()
                   for m, p in zip(CORE["COMPILED_MODULES"], CORE["source_files"]())}
        write_manifest(manifest, sources=sources)
        if os.path.abspath(manifest) != os.path.abspath(SOURCE_MANIFEST) and os.path.exists(SOURCE_MANIFEST):
            os.remove(SOURCE_MANIFEST)      # an older note beside the sources no longer applies

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.core_failures.append(f"{ext.name}: {type(exc).__name__}: {exc}")
            raise


setup(ext_modules=ext_modules(), cmdclass={"build_ext": CoreBuildExt})
