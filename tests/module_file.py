"""Import a Python file outside the package (a script, an example policy) as a module."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load_module_file(path: Path, name: str) -> ModuleType:
    """The module of ``path`` under ``name``, executed once per call."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
