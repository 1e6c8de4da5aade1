"""tokenfair: contract-driven fair scheduling for multi-tenant LLM serving.

Layers (see docs/ARCHITECTURE.md): contract -> admission -> weighted fair queue ->
in-queue order -> iteration batching/preemption, driven by one loop over a simulated
or a real engine.
"""

from .core_build import install as _install_core

__version__ = "0.1.0"

_install_core()        # compiled or interpreted core: decided before any core module imports
