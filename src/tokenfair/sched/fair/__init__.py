"""``fair``: tokenfair's four-layer policy (admission, weighted fair queue, in-queue order,
iteration batching/preemption).  Each layer is its own module; see :mod:`.policy`."""

from ..registry import register
from .policy import FairPolicy

register("fair", FairPolicy)

__all__ = ["FairPolicy"]
