"""The scheduler's parts built and exercised alone: the block pool's decode methods, the
running set, the admitter, the applier and the decode advance (``sched/decode.py``)."""

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.kv import BlockPool
from tokenfair.core.reasons import Reason, ReasonCode
from tokenfair.core.request import Request, Status
from tokenfair.sched.admit import Admitter
from tokenfair.sched.apply import Applier
from tokenfair.sched.decode import advance_decodes
from tokenfair.sched.interface import SchedulerOutput, StepResult
from tokenfair.sched.policy import Budget
from tokenfair.sched.predictor import OnlinePredictor
from tokenfair.sched.registry import make_policy
from tokenfair.sched.state import RunningSet


def _req(i: int, tenant: str = "a", prompt: int = 10, max_tokens: int = 5) -> Request:
    return Request(f"r{i}", i, tenant, "default", 0.0, prompt, max_tokens)


def _decoding(pool: BlockPool, i: int, tenant: str = "a", prompt: int = 8, max_tokens: int = 5) -> Request:
    """A running request whose prompt is computed and first token sampled (decoding)."""
    r = _req(i, tenant, prompt, max_tokens)
    pool.grow(r, prompt)
    r.num_computed, r.num_output, r.first_token_s = prompt, 1, 0.0
    r.status = Status.RUNNING
    return r


def _parts(num_blocks: int = 16, block_size: int = 4):
    policy = make_policy("fifo")
    contract, profile = parse_contract({}), load_profile(None)
    pool = BlockPool(num_blocks, block_size, host_blocks=8)
    predictor = OnlinePredictor()
    policy.bind(contract, profile, pool, predictor)
    runs = RunningSet(pool)
    return policy, runs, Admitter(policy, runs, profile.kv_bytes_per_token), Applier(policy, predictor, runs)


def test_pool_decode_growth_query_matches_mutation():
    pool = BlockPool(10, 4)
    a, b = _decoding(pool, 0, "a", prompt=8), _decoding(pool, 1, "b", prompt=5)   # 2 + 2 blocks
    assert pool.needs_block(a) and not pool.needs_block(b)       # 8 tokens fill 2 blocks
    need = pool.blocks_to_decode([a, b], 6)                      # a: 14 -> 4, b: 11 -> 3
    assert need == 3
    assert pool.grow_decodes([a, b], 6) == need
    assert (a.blocks, b.blocks, pool.num_free, pool.held) == (4, 3, 3, {"a": 4, "b": 3})
    pool.add_block(a)
    pool.add_blocks([a, b])
    assert (a.blocks, b.blocks, pool.num_free, pool.held) == (6, 4, 0, {"a": 6, "b": 4})
    assert not pool.can_add_blocks(1)
    with pytest.raises(RuntimeError):
        pool.add_block(b)
    with pytest.raises(RuntimeError):
        pool.add_blocks([a])


def test_pool_drop_swapped_frees_host_blocks():
    pool = BlockPool(10, 4, host_blocks=4)
    r = _decoding(pool, 0, prompt=8)
    assert pool.swap_out(r) == 2 and pool.host_used == 2
    pool.drop_swapped(r)
    assert pool.host_used == 0 and pool.num_free == 10


def test_advance_decodes_counts_tokens_and_reports_max_tokens():
    pool = BlockPool(10, 4)
    a, b = _decoding(pool, 0, max_tokens=4), _decoding(pool, 1, max_tokens=10)
    b.first_token_s = None
    assert advance_decodes([a, b], 3, 2.5) == [a]                # a: 4 outputs, at its max
    assert (a.num_computed, a.num_output, b.num_output, b.first_token_s, a.first_token_s) == (11, 4, 4, 2.5, 0.0)


def test_running_set_checks_and_releases():
    _, runs, _, _ = _parts()
    a, b = _decoding(runs.pool, 0), _decoding(runs.pool, 1, "b")
    runs.requests = [a, b]
    runs.check(max_running=2)
    with pytest.raises(AssertionError):
        runs.check(max_running=1)
    a.status = Status.FINISHED
    runs.release_ended([a])
    assert runs.requests == [b] and a.blocks == 0 and runs.pool.held["a"] == 0
    runs.check(max_running=2)
    runs.remove(b)
    assert runs.requests == [] and runs.pool.num_free == runs.pool.num_blocks


def test_admitter_admits_in_order_within_slots_and_counts_evictions():
    policy, runs, admitter, _ = _parts()
    reqs = [_req(i, prompt=6) for i in range(3)]
    for r in reqs:
        policy.enqueue(r, 0.0)
    out = SchedulerOutput()
    admitter.admit(out, Budget(100, 10, False), 2, 0.0)      # two slots
    assert runs.requests == reqs[:2] and [r for r, _ in out.prefill] == reqs[:2]
    assert all(r.status is Status.RUNNING and r.blocks == 2 for r in reqs[:2])
    assert policy.num_waiting() == 1
    runs.requests.remove(reqs[1])
    admitter.preempt(reqs[1], out, 1.0)
    assert reqs[1].status is Status.WAITING and reqs[1].blocks == 0 and reqs[1] not in [r for r, _ in out.prefill]
    assert (admitter.num_preemptions, policy.num_waiting()) == (1, 2)
    runs.check(max_running=2)


def test_applier_applies_a_step_and_ends_requests_once():
    _, runs, _, applier = _parts()
    a, b = _decoding(runs.pool, 0, max_tokens=2), _decoding(runs.pool, 1, "b", max_tokens=9)
    runs.requests = [a, b]
    for r in (a, b):
        runs.pool.grow(r, 1)
    out = SchedulerOutput(decode=[a, b])
    ended = applier.update_from_output(out, StepResult(0.01), 1.0)
    assert ended == [a] and (a.status, a.reason_code, a.reason, a.finish_s) == \
        (Status.FINISHED, ReasonCode.MAX_TOKENS, "max_tokens", 1.0)
    assert runs.requests == [b] and b.num_output == 2 and a.blocks == 0
    assert out.decode_counts == ({"a": 1, "b": 1}, {"default": 2})
    assert applier.take_ended() == []
    applier.end(b, Status.FAILED, Reason(ReasonCode.ENGINE_ERROR, "test"), 2.0)
    assert applier.take_ended() == [b] and b.reason == "engine_error: test"


def test_pool_mirrors_an_outside_allocator_in_place():
    pool = BlockPool(10, 4)
    held = pool.held                                           # the fair policy keeps this dict
    a, b, c = _req(0, "a"), _req(1, "b"), _req(2, "a")
    pool.mirror(3, [(a, 2), (b, 4), (c, 1)])
    assert pool.held is held and held == {"a": 3, "b": 4} and pool.num_free == 3 and b.blocks == 4
    pool.drop_mirrored(a)
    assert a.blocks == 0 and held == {"a": 1, "b": 4}
    pool.mirror(9, [(b, 1)])
    assert held == {"b": 1} and pool.num_free == 9
