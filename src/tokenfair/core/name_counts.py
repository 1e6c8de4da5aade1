"""Counting requests by tenant and by class: each step's decodes, a decode run's requests.

Performance hack.  Counting names into a dict (``count_names``: ``collections``'
``_count_elements``) hashes and looks up every name, about 35 ns a request, and the simulator
counts every scheduled step's decodes -- a tenth of the fair policy's loop on a trace of 20
tenants (``docs/BENCHMARKS.md``).  :class:`NameCounts` gives each tenant and class name a
small index once, stores it on the request (``Request.tenant_idx`` / ``class_idx``, valid
while ``Request.counts_owner`` is this counter), and counts with list increments; the
dicts it returns are those ``count_by_tenant_and_class`` returns, in first-seen order
(``tests/test_name_counts.py``).
"""

from __future__ import annotations

from .request import Request


class NameCounts:
    """Invariants: ``tenant_names[i]`` is the tenant of index i and ``tenant_index`` its
    inverse (the same for classes); between calls every entry of ``tenant_counts`` and
    ``class_counts`` is 0, one entry per name."""

    def __init__(self) -> None:
        self.tenant_index: dict[str, int] = {}
        self.tenant_names: list[str] = []
        self.tenant_counts: list[int] = []
        self.class_index: dict[str, int] = {}
        self.class_names: list[str] = []
        self.class_counts: list[int] = []

    def take(self, req: Request) -> None:
        """Give ``req`` this counter's indices of its tenant and its class."""
        req.tenant_idx = _index_of(req.tenant, self.tenant_index, self.tenant_names, self.tenant_counts)
        req.class_idx = _index_of(req.klass, self.class_index, self.class_names, self.class_counts)
        req.counts_owner = self

    def count(self, reqs: list[Request]) -> tuple[dict[str, int], dict[str, int]]:
        """(requests per tenant, per class), each dict in first-seen order: O(len(reqs)) list
        increments, O(names seen) dict work."""
        tenant_counts, class_counts = self.tenant_counts, self.class_counts
        tenants_seen: list[int] = []
        classes_seen: list[int] = []
        for r in reqs:
            if r.counts_owner is not self:
                self.take(r)                   # appends to the count lists in place
            i = r.tenant_idx
            n = tenant_counts[i]
            if n == 0:
                tenants_seen.append(i)
            tenant_counts[i] = n + 1
            j = r.class_idx
            m = class_counts[j]
            if m == 0:
                classes_seen.append(j)
            class_counts[j] = m + 1
        return (_take_counts(tenants_seen, self.tenant_names, tenant_counts),
                _take_counts(classes_seen, self.class_names, class_counts))


def _index_of(name: str, index: dict[str, int], names: list[str], counts: list[int]) -> int:
    i = index.get(name)
    if i is None:
        i = len(names)
        index[name] = i
        names.append(name)
        counts.append(0)
    return i


def _take_counts(seen: list[int], names: list[str], counts: list[int]) -> dict[str, int]:
    """The counts of the indices ``seen`` by name (in that order), set back to 0."""
    out: dict[str, int] = {}
    for i in seen:
        out[names[i]] = counts[i]
        counts[i] = 0
    return out
