"""One (tenant, class) queue of the fair policy (``sched/fair/class_queue.py``): a burst's
requests that can still get their first token within the max wait go before those of the
burst that no longer can; the requests that arrive later in the backlog spell keep arrival
order behind them."""

from hypothesis import given, settings, strategies as st

from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.class_queue import ClassQueue, best_head, is_burst, is_late
from tokenfair.sched.fair.lookahead import SHED_LOOKAHEAD_S
from tokenfair.sched.fair.ordering import live, order_key

MAX_WAIT_S = 300.0
TTFT_S = 2.0                       # the time-to-first-token estimate the tests give the queue


def _req(seq: int, at: float, max_wait_s: float | None = MAX_WAIT_S) -> Request:
    return Request(f"r{seq}", seq, "t", "batch", at, 1000, 100, max_wait_s=max_wait_s)


def _queue(splits: bool = True) -> ClassQueue:
    return ClassQueue(splits, lambda r: TTFT_S)


def _push(q: ClassQueue, r: Request) -> None:
    r.qtoken += 1
    q.push(order_key(r, 0.0, 16), r)


def _take(r: Request) -> None:
    r.qtoken += 1
    r.status = Status.RUNNING


def test_lateness_counts_the_first_token_and_ends_with_it():
    r = _req(0, 10.0)
    assert not is_late(r, 10.0 + MAX_WAIT_S - TTFT_S, TTFT_S)
    assert is_late(r, 10.0 + MAX_WAIT_S - TTFT_S + 0.01, TTFT_S)
    r.first_token_s = 20.0                          # preempted after its first token
    assert not is_late(r, 10.0 + 2 * MAX_WAIT_S, TTFT_S)
    assert not is_late(_req(1, 0.0, max_wait_s=None), 1e6, TTFT_S)


def test_a_burst_request_is_one_the_forecast_could_not_shed():
    since = 100.0
    assert is_burst(_req(0, since + MAX_WAIT_S - SHED_LOOKAHEAD_S - 0.01), since)
    assert not is_burst(_req(1, since + MAX_WAIT_S - SHED_LOOKAHEAD_S), since)
    assert not is_burst(_req(2, since, max_wait_s=None), since)
    assert not is_burst(_req(3, since, max_wait_s=SHED_LOOKAHEAD_S), since)   # sheds from the start


def test_a_late_burst_request_yields_to_the_burst_and_precedes_later_arrivals():
    q = _queue()
    old, young = _req(0, 0.0), _req(1, 50.0)
    after = _req(2, MAX_WAIT_S - SHED_LOOKAHEAD_S + 1.0)      # arrived when shedding was possible
    for r in (old, young, after):
        _push(q, r)
    assert q.head(100.0, 0.0)[-1] is old                      # all in time: key order
    now = MAX_WAIT_S - TTFT_S + 1.0                           # old's first token would come too late
    assert q.head(now, 0.0)[-1] is young
    assert [e[-1] for e in q.late.h] == [old]
    _take(young)
    assert q.head(now, 0.0)[-1] is old                        # before the later arrival
    _take(old)
    assert q.head(now, 0.0)[-1] is after
    _take(after)
    assert q.head(now, 0.0) is None


def test_without_the_split_the_queue_keeps_key_order():
    q = _queue(splits=False)
    old, young = _req(0, 0.0), _req(1, 50.0)
    for r in (old, young):
        _push(q, r)
    assert q.head(MAX_WAIT_S + 10.0, 0.0)[-1] is old and not q.late.h


def test_best_head_reads_each_class_queue_at_the_spell():
    a, b = _queue(), _queue()
    old, young = _req(0, 0.0), _req(1, 50.0)
    _push(a, old)
    _push(a, young)
    other = _req(2, 20.0)
    other.klass = "other"
    _push(b, other)
    now = MAX_WAIT_S - TTFT_S + 1.0
    assert best_head({"batch": a, "other": b}, now, 0.0) is other   # old is late, other's vd is sooner
    # the same queues with a spell that began long before: nothing is a burst request
    assert best_head({"batch": a, "other": b}, now, -MAX_WAIT_S) is old


_OPS = st.lists(st.tuples(st.sampled_from(["push", "take", "wait", "look"]),
                          st.floats(min_value=0.0, max_value=60.0), st.integers(min_value=0, max_value=10_000)),
                min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS, max_wait_s=st.sampled_from([120.0, 300.0, 600.0]))
def test_the_head_is_the_first_in_time_burst_request_else_the_first_of_the_rest(ops, max_wait_s):
    """Against a reference over the live requests (the estimate constant, time moving on):
    with ``A`` the burst requests in time and ``b`` the least key of the others that are not
    burst requests, the head is ``A``'s least if it is below ``b``, else the least of the
    requests not in ``A``; each live request has one live entry in the two heaps."""
    q = ClassQueue(True, lambda r: TTFT_S)
    since, now, seq = 0.0, 0.0, 0
    waiting: list[Request] = []
    for op, dt, pick in ops:
        if op == "push":
            r = _req(seq, now, max_wait_s)
            seq += 1
            _push(q, r)
            waiting.append(r)
        elif op == "take" and waiting:
            _take(waiting.pop(pick % len(waiting)))
        elif op == "wait":
            now += dt * 5
        keys = {id(r): order_key(r, 0.0, 16) + (r.qtoken,) for r in waiting}
        in_time = [r for r in waiting if is_burst(r, since) and not is_late(r, now, TTFT_S)]
        rest = [r for r in waiting if not (is_burst(r, since) and not is_late(r, now, TTFT_S))]
        later = [r for r in rest if not is_burst(r, since)]
        head = q.head(now, since)
        if not waiting:
            assert head is None
            continue
        least = min(in_time + rest, key=lambda r: keys[id(r)])
        if in_time and (not later or keys[id(min(in_time, key=lambda r: keys[id(r)]))] < min(keys[id(r)] for r in later)):
            expected = min(in_time, key=lambda r: keys[id(r)])
        else:
            expected = min(rest, key=lambda r: keys[id(r)])
        assert head is not None and head[-1] is expected, (least.seq, expected.seq, head[-1].seq)
        live_ids = [id(e[-1]) for e in q.entries() if live(e)]
        assert sorted(live_ids) == sorted(id(r) for r in waiting)
        assert all(is_late(e[-1], now, TTFT_S) for e in q.late.h if live(e))
