"""tokenfair inside vLLM: a scheduler class for ``--scheduler-cls``.

    python -m vllm.entrypoints.openai.api_server --model DIR \\
        --scheduler-cls tokenfair.integrations.vllm.TokenfairScheduler \\
        --additional-config '{"tokenfair_contract": "contract.yaml"}'

Requests name their tenant and class in ``vllm_xargs`` (``{"tenant": ..., "class": ...}``;
the tokenfair gateway sets them from the authenticated tenant).  Built for one vLLM release
(:data:`~.compat.PINNED_VLLM_VERSION`): loading the scheduler classes with another raises
:class:`~.compat.VllmInterfaceError` naming both.  The policy side (``bridge``, ``settings``)
imports no vLLM.  See docs/VLLM.md.
"""

from .compat import PINNED_VLLM_VERSION, VllmInterfaceError, check_vllm_version

SCHEDULER_CLASSES = ("TokenfairScheduler", "TokenfairAsyncScheduler")

__all__ = ["PINNED_VLLM_VERSION", "VllmInterfaceError", "check_vllm_version", *SCHEDULER_CLASSES]


def __getattr__(name: str):
    if name in SCHEDULER_CLASSES:
        from . import scheduler          # checks the vLLM version first
        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
