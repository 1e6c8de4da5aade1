"""``NameCounts`` (core/name_counts.py) counts as ``count_by_tenant_and_class`` does: the same
dicts in the same (first-seen) order, whatever the requests, call after call, and with
requests that another counter indexed first."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfair.core.name_counts import NameCounts
from tokenfair.core.request import Request, count_by_tenant_and_class

TENANTS = [f"t{i}" for i in range(6)]
CLASSES = ["interactive", "batch", "t0"]          # a class may share a tenant's name


def _requests(pairs):
    return [Request(f"r{i}", i, TENANTS[t], CLASSES[k], 0.0, 10, 5) for i, (t, k) in enumerate(pairs)]


pairs = st.lists(st.tuples(st.integers(0, len(TENANTS) - 1), st.integers(0, len(CLASSES) - 1)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(pairs, min_size=1, max_size=5))
def test_counts_equal_the_dict_counts_in_first_seen_order(steps):
    counter, other = NameCounts(), NameCounts()
    for step in steps:
        reqs = _requests(step)
        other.count(reqs[::2])                    # half of them indexed by another counter first
        got = counter.count(reqs)
        want = count_by_tenant_and_class(reqs)
        assert got == want
        assert [list(d) for d in got] == [list(d) for d in want]     # the same order
        assert not any(counter.tenant_counts) and not any(counter.class_counts)


def test_a_request_keeps_its_indices_while_its_counter_is_the_same():
    counter = NameCounts()
    reqs = _requests([(3, 1), (1, 0), (3, 0)])
    assert counter.count(reqs) == ({"t3": 2, "t1": 1}, {"batch": 1, "interactive": 2})
    assert [r.counts_owner is counter for r in reqs] == [True] * 3
    assert counter.tenant_names == ["t3", "t1"] and [r.tenant_idx for r in reqs] == [0, 1, 0]
    assert counter.count([reqs[1]]) == ({"t1": 1}, {"interactive": 1})
