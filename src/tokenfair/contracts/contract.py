"""The service contract: tenants, service classes, costs, engine budgets, preemption.

A contract is a YAML file validated by pydantic v2 (``extra="forbid"``).  Every model is
frozen: a loaded contract never changes while a run uses it.  Errors are reported as
``path: message`` lines (``tenants.acme.weight: must be > 0``), raised as
:class:`ContractError`; the CLI turns them into exit status 2.

Invariants enforced here:
  * every weight > 0, every min_share in [0, 1), and the reserved min shares of all named
    tenants sum to at most 1 (the default template is not counted: it reserves nothing
    unless named tenants leave room);
  * every class a tenant allows exists; the tenant's default class is among its allowed ones;
  * engine budgets are positive and chunk_size <= prefill_token_budget.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


Model = TypeVar("Model", bound=BaseModel)


class ContractError(ValueError):
    """A contract that cannot be used; the message names each bad path and the fix."""


class _Frozen(BaseModel):
    # a contract number is finite: an infinite weight, cost or wait divides or multiplies every
    # charge (S_i += c / w_i) into 0, inf or nan, so .inf is refused as NaN already is
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RateLimit(_Frozen):
    """Token bucket over cost-weighted tokens: refills ``tokens_per_s``, holds ``burst_tokens``."""

    tokens_per_s: float = Field(gt=0)
    burst_tokens: float = Field(gt=0)


class TenantSpec(_Frozen):
    weight: float = Field(default=1.0, gt=0)
    min_share: float = Field(default=0.0, ge=0, lt=1)
    max_concurrency: int | None = Field(default=None, gt=0)
    rate_limit: RateLimit | None = None
    kv_quota_tokens: int | None = Field(default=None, gt=0)
    kv_quota_blocks: int | None = Field(default=None, gt=0)
    max_queued: int = Field(default=10_000, gt=0)
    classes: tuple[str, ...] | None = None  # None: every class
    default_class: str | None = None
    api_key_sha256: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_kv_quota(self) -> "TenantSpec":
        if self.kv_quota_tokens is not None and self.kv_quota_blocks is not None:
            raise ValueError("give kv_quota_tokens or kv_quota_blocks, not both")
        return self


class ClassSpec(_Frozen):
    priority: float = 0.0
    aging_rate: float = Field(default=0.0, ge=0)
    max_wait_s: float | None = Field(default=None, gt=0)
    ttft_slo_s: float | None = Field(default=None, gt=0)
    tpot_slo_s: float | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)
    preemptible: bool = True
    min_share: float = Field(default=0.0, ge=0, lt=1)


class CostWeights(_Frozen):
    prefill_token: float = Field(default=1.0, ge=0)
    decode_token: float = Field(default=2.0, ge=0)
    kv_block_s: float = Field(default=0.0, ge=0)


class EngineBudgets(_Frozen):
    prefill_token_budget: int = Field(default=2048, gt=0)
    decode_token_budget: int = Field(default=256, gt=0)
    chunk_size: int = Field(default=512, gt=0)
    max_running: int = Field(default=256, gt=0)
    max_consecutive_prefill_steps: int = Field(default=8, gt=0)
    # fair policy: a tenant that is not light runs at most this many prefills longer than one
    # chunk at once, times floor(its weight / the least tenant weight)
    max_long_prefills_per_tenant: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _chunk_fits(self) -> "EngineBudgets":
        if self.chunk_size > self.prefill_token_budget:
            raise ValueError("chunk_size must be <= prefill_token_budget")
        return self


class PreemptionSpec(_Frozen):
    mode: Literal["recompute", "swap", "auto"] = "auto"
    max_per_request: int = Field(default=2, ge=0)
    min_benefit_ratio: float = Field(default=2.0, gt=0)
    cooldown_s: float = Field(default=1.0, ge=0)


class AdmissionSpec(_Frozen):
    """Admission control.

    Load shedding (on by default): refuse, with reason ``overloaded`` and a retry hint, a
    request whose predicted wait exceeds ``shed_margin`` x its class's max_wait_s.  The fair
    policy's forecast is work-conserving (sched/fair/forecast.py: the capacity the tenants
    that are not backlogged leave idle, shared by weight among the backlogged ones until each
    drains; a tenant backlogged for a while drains at its measured rate) and looks at most a
    minute, or half the max wait, ahead: a request of a class whose max wait is a minute or
    less is rejected at arrival when its forecast is over 1.25x that max wait; a waiting
    request is reviewed when a minute, or half its max wait, is left, and again each time
    what is left halves, and it leaves the queue (``expired``) when the rest of its wait is
    forecast over what is left (sched/fair/review.py).  ``shed_margin`` defaults to 1.0: a
    request is refused only when it would wait past its max wait anyway.  On by default
    because an overdue request costs its tenant the same engine work as an early 429 and,
    queued, it lengthens every later request's wait: on whale, flood and many-light fair's
    in-time goodput is 1.3-1.7x what the same policy gets with it off, at a shedding
    precision of 94-99%, and 79 of the 80 requests burst-long sheds from the queue were late
    unshed (``tokenfair bench shedding``, docs/BENCHMARKS.md).  Off until ``warmup_s`` of
    service."""

    shed_over_max_wait: bool = True
    shed_margin: float = Field(default=1.0, gt=0)
    warmup_s: float = Field(default=10.0, ge=0)
    # Headroom: the last fraction of KV blocks and running slots is reserved for tenants
    # that hold less than their weight share (w_i / sum of all tenants' weights) of them.
    headroom_kv_fraction: float = Field(default=0.1, ge=0, lt=1)
    headroom_slot_fraction: float = Field(default=0.05, ge=0, lt=1)


class BorrowingSpec(_Frozen):
    enabled: bool = True
    reclaim: Literal["stop_admitting", "preempt"] = "stop_admitting"


DEFAULT_CLASSES = {
    "realtime": ClassSpec(priority=30, aging_rate=1.0, max_wait_s=10, ttft_slo_s=0.5, tpot_slo_s=0.05),
    "interactive": ClassSpec(priority=20, aging_rate=1.0, max_wait_s=30, ttft_slo_s=2.0, tpot_slo_s=0.1),
    "batch": ClassSpec(priority=0, aging_rate=0.5, max_wait_s=600, preemptible=True),
}


_HEX = frozenset("0123456789abcdefABCDEF")
SHA256_HEX_CHARS = 64


def _check_key_digests(tenant: str, digests: tuple[str, ...]) -> None:
    """Every entry must be a hex SHA-256 digest: a key pasted in place of its digest (or a
    placeholder) would never match, and every request of the tenant would get a 401."""
    for i, d in enumerate(digests):
        d = d.strip()
        if len(d) != SHA256_HEX_CHARS or not set(d) <= _HEX:
            raise ValueError(f"tenant {tenant!r}: api_key_sha256[{i}] is not a SHA-256 digest ({SHA256_HEX_CHARS} hex "
                             f"characters; got {len(d)} characters): store the digest of the key, printed by "
                             "`tokenfair keys hash KEY`, never the key itself")


class Contract(_Frozen):
    version: str = "unversioned"
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)
    default_tenant: TenantSpec = TenantSpec()
    classes: dict[str, ClassSpec] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))
    default_class: str = "interactive"
    costs: CostWeights = CostWeights()
    engine: EngineBudgets = EngineBudgets()
    preemption: PreemptionSpec = PreemptionSpec()
    borrowing: BorrowingSpec = BorrowingSpec()
    admission: AdmissionSpec = AdmissionSpec()
    # a live change that removes a tenant: its keys get 401 tenant_removed ("reject"), or go on
    # authenticating it, served under default_tenant ("default_template")
    removed_tenants: Literal["reject", "default_template"] = "reject"

    @model_validator(mode="after")
    def _consistent(self) -> "Contract":
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not among classes {sorted(self.classes)}")
        class_total = sum(c.min_share for c in self.classes.values())
        if class_total > 1 + 1e-9:
            raise ValueError(f"classes' min_share values sum to {class_total:.3f} > 1; lower them so they sum to at most 1")
        total = sum(t.min_share for t in self.tenants.values())
        if total > 1 + 1e-9:
            raise ValueError(f"tenants' min_share values sum to {total:.3f} > 1; lower them so they sum to at most 1")
        for name, spec in self.tenants.items():
            _check_key_digests(name, spec.api_key_sha256)
        if self.default_tenant.api_key_sha256:
            raise ValueError("default_tenant lists api_key_sha256, but a key names one tenant: move the digests "
                             "under tenants.<name>.api_key_sha256")
        for name, spec in [*self.tenants.items(), ("default_tenant", self.default_tenant)]:
            for c in spec.classes or ():
                if c not in self.classes:
                    raise ValueError(f"tenant {name!r} allows unknown class {c!r}; define it under classes")
            if spec.default_class is not None:
                if spec.default_class not in self.classes:
                    raise ValueError(f"tenant {name!r} default_class {spec.default_class!r} is not a class")
                if spec.classes is not None and spec.default_class not in spec.classes:
                    raise ValueError(f"tenant {name!r} default_class {spec.default_class!r} is not in its classes")
        return self

    # -- lookups ---------------------------------------------------------------------
    def tenant(self, name: str) -> TenantSpec:
        """The spec for ``name``: its own entry or the default template."""
        return self.tenants.get(name, self.default_tenant)

    def class_for(self, tenant: str, requested: str | None) -> str | None:
        """The class a request runs in, or None when the tenant may not use ``requested``."""
        spec = self.tenant(tenant)
        if requested is None or requested == "":
            return spec.default_class or (self.default_class if spec.classes is None or self.default_class in spec.classes else spec.classes[0])
        if requested not in self.classes:
            return None
        if spec.classes is not None and requested not in spec.classes:
            return None
        return requested

    @property
    def content_hash(self) -> str:
        d = self.model_dump(mode="json")
        if d["removed_tenants"] == "reject":    # the default: hashes of contracts that never set it stay
            del d["removed_tenants"]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def identity(self) -> dict[str, str]:
        return {"contract_version": self.version, "contract_hash": self.content_hash}


def format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        msg = msg.replace("Input should be greater than", "must be >").replace(
            "Input should be less than", "must be <"
        ).replace("Extra inputs are not permitted", "unknown field; remove it or fix its spelling")
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def parse_mapping(model: type[Model], data: object, source: str, what: str, error: type[ValueError]) -> Model:
    """``model`` validated from a YAML document's top-level mapping (None: empty); anything
    else, or an invalid field, raises ``error`` naming ``source`` (and ``what`` the document is)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{source}: {what} must be a YAML mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(format_errors(err, source)) from None


def parse_contract(data: object, source: str = "<contract>") -> Contract:
    return parse_mapping(Contract, data, source, "the contract", ContractError)


def read_yaml(path: str | Path, what: str, error: type[ValueError]) -> object:
    """The parsed YAML in ``path``; unreadable or invalid files raise ``error`` naming the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise error(f"{p}: cannot read the {what} ({err.strerror}); check the path") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise error(f"{p}: not valid YAML: {err}") from None


def load_contract(path: str | Path) -> Contract:
    return parse_contract(read_yaml(path, "contract", ContractError), str(path))


def contract_schema() -> dict:
    return Contract.model_json_schema()
