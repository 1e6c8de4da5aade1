"""A semantic diff of two contracts: per tenant and class, the fields changed, and the share
each tenant is entitled to under contention before and after.

Contention means every named tenant is backlogged at once: tenant i's entitled share is its
weight share water-filled up to its ``min_share`` (:func:`tokenfair.evaluation.metrics.entitled_shares`,
the same rule the fairness metrics and the fair policy use).  Tenants present in only one
contract show ``-`` on the other side; a removed tenant's later requests fall under
``default_tenant``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract import Contract
from ..evaluation.metrics import entitled_shares

_SECTIONS = ("costs", "engine", "preemption", "borrowing", "admission")


@dataclass(frozen=True, slots=True)
class FieldChange:
    where: str          # "tenant acme", "class batch", "engine", "contract"
    field: str          # dotted field path inside it ("rate_limit.tokens_per_s")
    before: object      # value in A (None: absent)
    after: object       # value in B (None: absent)


@dataclass(frozen=True, slots=True)
class ContractDiff:
    a: str                                   # "version@hash" of A
    b: str                                   # "version@hash" of B
    changes: list[FieldChange]               # in a stable order: tenants, classes, sections
    shares: dict[str, tuple[float | None, float | None]]   # tenant -> (entitled in A, in B)

    @property
    def same(self) -> bool:
        return not self.changes


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out |= _flat(v, key)
        else:
            out[key] = v
    return out


def _compare(where: str, a: dict | None, b: dict | None) -> list[FieldChange]:
    if a is None or b is None:
        side = "added" if a is None else "removed"
        return [FieldChange(where, f"({side})", None if a is None else "present", None if b is None else "present")]
    fa, fb = _flat(a), _flat(b)
    return [FieldChange(where, k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def contention_shares(c: Contract) -> dict[str, float]:
    """Every named tenant's entitled share when all of them are backlogged."""
    if not c.tenants:
        return {}
    return entitled_shares({t: s.weight for t, s in c.tenants.items()},
                           {t: s.min_share for t, s in c.tenants.items()})


def diff_contracts(a: Contract, b: Contract) -> ContractDiff:
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    changes: list[FieldChange] = []
    if da["version"] != db["version"]:
        changes.append(FieldChange("contract", "version", da["version"], db["version"]))
    for top in ("default_class", "removed_tenants"):
        if da[top] != db[top]:
            changes.append(FieldChange("contract", top, da[top], db[top]))
    for t in sorted(set(da["tenants"]) | set(db["tenants"])):
        changes += _compare(f"tenant {t}", da["tenants"].get(t), db["tenants"].get(t))
    changes += _compare("default_tenant", da["default_tenant"], db["default_tenant"])
    for k in sorted(set(da["classes"]) | set(db["classes"])):
        changes += _compare(f"class {k}", da["classes"].get(k), db["classes"].get(k))
    for s in _SECTIONS:
        changes += _compare(s, da[s], db[s])
    sa, sb = contention_shares(a), contention_shares(b)
    shares = {t: (sa.get(t), sb.get(t)) for t in sorted(set(sa) | set(sb))}
    return ContractDiff(f"{a.version}@{a.content_hash}", f"{b.version}@{b.content_hash}", changes, shares)


def _v(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:g}"
    if isinstance(x, list):
        return "[" + ", ".join(str(i)[:12] for i in x) + "]"
    return str(x)


def format_diff(d: ContractDiff) -> str:
    lines = [f"--- {d.a}", f"+++ {d.b}"]
    if d.same:
        lines.append("no semantic change (only the version label or formatting differs)" if d.a != d.b
                     else "identical")
    where = None
    for ch in d.changes:
        if ch.where != where:
            lines.append(f"{ch.where}:")
            where = ch.where
        lines.append(f"    {ch.field}: {_v(ch.before)} -> {_v(ch.after)}")
    if d.shares:
        lines.append("entitled share under contention (all named tenants backlogged; weights water-filled "
                     "with min shares):")
        lines.append(f"    {'tenant':<24}{'before':>10}{'after':>10}{'change':>10}")
        for t, (x, y) in d.shares.items():
            delta = "-" if x is None or y is None else f"{y - x:+.3f}"
            lines.append(f"    {t[:23]:<24}{_pct(x):>10}{_pct(y):>10}{delta:>10}")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
