"""tokenfair: contract-driven fair scheduling for multi-tenant LLM serving.

Layers (see docs/ARCHITECTURE.md): contract -> admission -> weighted fair queue ->
in-queue order -> iteration batching/preemption, driven by one loop over a simulated
or a real engine.
"""

__version__ = "0.1.0"


def _warn_if_stale() -> None:
    from ._core import stale_modules
    stale = stale_modules()
    if stale:
        import warnings
        warnings.warn(f"tokenfair: compiled modules older than their source ({', '.join(stale)}): "
                      "the old code runs; rebuild with `make compile` or drop the builds with "
                      "`make pure`", RuntimeWarning, stacklevel=2)


_warn_if_stale()
