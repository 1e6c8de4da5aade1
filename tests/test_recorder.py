"""The recorder's service series: per-bucket sums, the open bucket, time order."""

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.runtime.recorder import Recorder
from tokenfair.core.request import Request
from tokenfair.sched.interface import SchedulerOutput


def _decode_step(*tenants: str) -> SchedulerOutput:
    reqs = [Request(f"r{i}", i, t, "interactive", 0.0, 10, 10) for i, t in enumerate(tenants)]
    return SchedulerOutput(decode=reqs)


def test_service_per_bucket_with_the_open_bucket_read_mid_way():
    rec = Recorder(parse_contract({}).costs)
    rec.record_step(_decode_step("a", "a", "b"), 0.5, 0.1, 0, 3, 0.1)
    rec.record_step(_decode_step("a"), 0.9, 0.1, 0, 1, 0.1)
    mid = rec.to_json()                       # bucket 0 still open: what it holds so far
    # the default contract weighs a decode token 2.0
    assert mid["tenant_service"] == {"a": {0: 6.0}, "b": {0: 2.0}} and mid["tokens"] == {0: 4}
    rec.record_step(_decode_step("b"), 0.95, 0.05, 0, 1, 0.1)
    rec.record_step(_decode_step("b", "c"), 1.2, 0.1, 0, 2, 0.1)
    tl = rec.to_json()
    assert tl["tenant_service"] == {"a": {0: 6.0}, "b": {0: 4.0, 1: 2.0}, "c": {1: 2.0}}
    assert tl["class_service"] == {"interactive": {0: 10.0, 1: 4.0}}
    assert tl["tokens"] == {0: 5, 1: 2} and tl["num_steps"] == 4


def test_a_step_before_the_open_bucket_is_an_error():
    rec = Recorder(parse_contract({}).costs)
    rec.record_step(_decode_step("a"), 2.5, 0.1, 0, 1, 0.1)
    with pytest.raises(ValueError, match="time went back from bucket 2 to 1"):
        rec.record_step(_decode_step("a"), 1.5, 0.1, 0, 1, 0.1)
