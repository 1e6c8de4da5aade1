"""What a policy shows the service: a read-only snapshot of its per-tenant state.

The service layer (``serve/``: metrics and rate-limit headers; ``fleet/``: heartbeats, the
shared view and the door; the vLLM bridge) reads a policy only through
:meth:`~tokenfair.sched.policy.Policy.snapshot` and
:meth:`~tokenfair.sched.policy.Policy.tenant_view`, never through its parts.  Building a
snapshot changes nothing in the policy: decayed and refilled figures are computed as of
``now`` without being written back.  A policy that keeps no per-tenant state (the
baselines) shows no tenants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class TenantView:
    """One tenant as the policy holds it, as of the snapshot's ``now``."""
    name: str                  # the tenant's name (a key of the contract's tenants, or a default-template one)
    weight: float              # its contract weight, > 0
    min_share: float           # its guaranteed min share, in [0, 1] (0: none)
    num_waiting: int           # requests of it in the policy's waiting queue, >= 0
    queued_cost: float         # predicted cost (cost units) of those waiting requests, >= 0; 0 when none wait
    num_running: int           # requests of it admitted and not ended, >= 0
    bucket: float | None       # token-bucket level (cost units) refilled to now, <= burst (may be < 0 once);
    #                            None: the tenant has no token rate limit
    recent_service: float      # its service decayed with time constant share_tau_s to now, >= 0

    @property
    def is_active(self) -> bool:
        """It has waiting or running requests."""
        return self.num_waiting > 0 or self.num_running > 0


NO_TENANTS: Mapping[str, TenantView] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The policy's per-tenant state at one instant (nothing in it refers back to the policy)."""
    now: float                                  # the time the figures are as of (the policy's clock)
    share_tau_s: float | None = None            # time constant of recent_service, > 0; None: no share meter
    wfq_credit: float | None = None             # the WFQ's credit C (cost units; a returning tenant's tag
    #                                             starts at V - C / w), > 0; None: no virtual-time queue
    tenants: Mapping[str, TenantView] = field(default_factory=lambda: NO_TENANTS)   # by name, first-seen
    #                                             order; a read-only mapping (freeze_views)

    def queued_costs(self) -> dict[str, float]:
        """Predicted queued cost per tenant with waiting requests."""
        return {n: v.queued_cost for n, v in self.tenants.items() if v.num_waiting > 0}

    def backlogged(self) -> tuple[str, ...]:
        """The tenants with waiting requests, in first-seen order."""
        return tuple(n for n, v in self.tenants.items() if v.num_waiting > 0)


def freeze_views(views: list[TenantView]) -> Mapping[str, TenantView]:
    """``views`` as a read-only mapping by name (in the given order)."""
    return MappingProxyType({v.name: v for v in views})
