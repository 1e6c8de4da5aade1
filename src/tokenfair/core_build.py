"""Which core this process runs -- the mypyc-compiled extensions or the ``.py`` sources -- and why.

``setup.py`` compiles the modules ``_core.COMPILED_MODULES`` lists and leaves a manifest
beside them (``core_build.json``): the modules it compiled, each source's sha256, or why the
build failed.  ``import tokenfair`` decides, before any core module is imported:

* the extensions run only when the manifest says the build succeeded and every listed
  module's source still has the digest it was compiled from;
* otherwise every listed module imports from its ``.py`` -- all or none, since compiled
  modules call each other natively and a mix would run old code beside new -- with a
  ``RuntimeWarning`` when extensions are there but not used (stale, incomplete or failed);
* ``TOKENFAIR_PURE=1`` in the environment runs the interpreted core on purpose (no warning);
* a compiled (native) class is sealed: setting an attribute on it raises ``TypeError``,
  because compiled callers would ignore a patched method.

``tokenfair --version`` prints the decision (``core=mypyc`` or ``core=python`` and why).
This module imports nothing of the package but ``_core`` (it runs inside ``tokenfair/__init__``).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ._core import BUILD_MANIFEST, COMPILED_MODULES

PACKAGE_DIR = Path(__file__).resolve().parent
PURE_ENV = "TOKENFAIR_PURE"                 # "1": run the interpreted core
_LISTED = frozenset(COMPILED_MODULES)


@dataclass(frozen=True)
class CoreStatus:
    kind: str                   # "mypyc": the listed modules import from their extensions; else "python"
    reason: str                 # one line: why this kind (for --version and warnings)
    stale: tuple[str, ...]      # listed modules whose source differs from the one compiled
    num_extensions: int         # listed modules with an extension file beside their source


def source_path(module: str) -> Path:
    return (PACKAGE_DIR / Path(*module.split(".")[1:])).with_suffix(".py")


def extension_paths(module: str) -> list[Path]:
    source = source_path(module)
    return sorted(source.parent.glob(source.stem + ".*.so"))


def compiled_modules() -> list[str]:
    """The listed modules that have an extension file beside their source."""
    return [m for m in COMPILED_MODULES if extension_paths(m)]


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(folder: Path | None = None) -> dict | None:
    try:
        return json.loads(((folder or PACKAGE_DIR) / BUILD_MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def stale_modules(manifest: dict | None = None) -> list[str]:
    """Compiled modules whose source is not the one their extension was built from."""
    digests = (manifest if manifest is not None else read_manifest() or {}).get("sources", {})
    return [m for m in compiled_modules() if digests.get(m) != source_digest(source_path(m))]


def pure_requested(environ: os._Environ | dict = os.environ) -> bool:
    return environ.get(PURE_ENV, "") not in ("", "0")


def decide(environ: os._Environ | dict = os.environ) -> CoreStatus:
    """Which core to import, from the environment, the files and the manifest."""
    num_ext = len(compiled_modules())
    if pure_requested(environ):
        return CoreStatus("python", f"{PURE_ENV}=1", (), num_ext)
    manifest = read_manifest()
    failed = (manifest or {}).get("failed")
    if failed:
        return CoreStatus("python", f"the compiled build failed: {failed}", (), num_ext)
    if num_ext == 0:
        why = (manifest or {}).get("skipped") or "no compiled extensions (make pure, or not built)"
        return CoreStatus("python", why, (), 0)
    missing = [m for m in COMPILED_MODULES if not extension_paths(m)]
    if missing:
        return CoreStatus("python", f"extensions missing for {', '.join(missing)}: run make compile",
                          (), num_ext)
    stale = tuple(stale_modules(manifest))
    if manifest is None or stale:
        names = ", ".join(stale) if manifest is not None else "all (no build manifest)"
        return CoreStatus("python", f"extensions older than their source ({names}): run make compile",
                          stale, num_ext)
    return CoreStatus("mypyc", f"{num_ext} modules compiled", (), num_ext)


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the listed modules from their ``.py`` (the interpreted core)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _LISTED:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


class _SealingLoader(importlib.machinery.ExtensionFileLoader):
    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        seal_loaded_modules()


def seal_loaded_modules() -> int:
    """Seal the native classes of every listed module imported so far.  A compiled module
    imports the others of its group natively (no import hook runs for them, and they may be
    half-initialised when an inner hooked load finishes), so every hooked load seals all that
    are loaded; the outermost one runs last and sees them complete (setting the flag again is
    harmless).  Returns how many classes it sealed."""
    return sum(seal_native_classes(m) for m in (sys.modules.get(n) for n in COMPILED_MODULES) if m is not None)


class _SealingFinder(importlib.abc.MetaPathFinder):
    """Imports the listed modules from their extensions and seals their native classes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _LISTED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            spec.loader = _SealingLoader(fullname, spec.origin)
        return spec


# Safety hack (CPython only): mark a native class's type object immutable, so that
# ``Cls.method = f`` raises instead of being silently ignored by compiled callers.  The
# offset of ``tp_flags`` is found, not assumed: the one word where three known types hold
# their own ``__flags__``; where it cannot be found, classes stay unsealed.
_IMMUTABLE_TYPE = 1 << 8                    # Py_TPFLAGS_IMMUTABLETYPE (CPython >= 3.10)
_MAX_TYPE_HEADER = 512


def _flags_offset() -> int | None:
    class _Probe:
        pass
    probes = (_Probe, int, dict)
    step = ctypes.sizeof(ctypes.c_ulong)
    for offset in range(0, _MAX_TYPE_HEADER, step):
        if all(ctypes.c_ulong.from_address(id(t) + offset).value == t.__flags__ for t in probes):
            return offset
    return None


_FLAGS_OFFSET = _flags_offset() if sys.implementation.name == "cpython" else None


def seal_native_classes(module: ModuleType) -> int:
    """Seal the mypyc-native classes defined in ``module``; returns how many."""
    if _FLAGS_OFFSET is None:
        return 0
    num = 0
    for value in list(vars(module).values()):
        if (isinstance(value, type) and value.__module__ == module.__name__
                and "__mypyc_attrs__" in value.__dict__):
            flags = ctypes.c_ulong.from_address(id(value) + _FLAGS_OFFSET)
            flags.value |= _IMMUTABLE_TYPE
            num += 1
    return num


STATUS: CoreStatus | None = None


def install() -> CoreStatus:
    """Decide the core once and put the import hook for it first on ``sys.meta_path``."""
    global STATUS
    if STATUS is not None:
        return STATUS
    STATUS = decide()
    finder = _SealingFinder() if STATUS.kind == "mypyc" else _SourceFinder()
    sys.meta_path.insert(0, finder)
    if STATUS.kind == "python" and STATUS.num_extensions and not pure_requested():
        warnings.warn(f"tokenfair: running the interpreted core: {STATUS.reason}",
                      RuntimeWarning, stacklevel=3)
    return STATUS


def core_kind() -> str:
    """"mypyc" when the listed modules import from their extensions, else "python"."""
    return install().kind


def describe() -> str:
    status = install()
    return f"core={status.kind} ({status.reason})"
