"""The iteration scheduler's fields, declared once for the classes that share them.

``ApplyMixin`` (``sched/apply.py``), ``AdmitMixin`` (``sched/admit.py``) and
:class:`~tokenfair.sched.scheduler.IterationScheduler` form one inheritance chain on this
class, so each part names the fields it uses with their types (a type checker and mypyc
see them); ``IterationScheduler.__init__`` assigns them.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.request import Request
from .policy import Policy
from .predictor import Predictor


@mypyc_attr(allow_interpreted_subclasses=True)     # so is each class of the chain
class SchedulerState:
    policy: Policy
    contract: Contract
    profile: Profile
    pool: BlockPool
    predictor: Predictor
    running: list[Request]
    ended: list[Request]                    # terminal requests not yet collected by the loop
    num_preemptions: int
    num_recomputed_tokens: int
    num_swapped_blocks: int
    num_steps: int                          # schedule() calls (numbers held-decode runs)
    num_fast_forwarded_steps: int           # of num_steps, those applied by sim/fastforward.py
    step_stats: tuple[int, int, list[Request]]     # last step: decodes, context sum, prefills
    maybe_prefilling: list[Request] | None  # after the last step: the only running requests
                                            # that may not be decoding (None: unknown)
