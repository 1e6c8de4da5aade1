"""The gateway's dispatcher built alone (no Gateway, no HTTP): a real fair policy, a job book,
fake proxy coroutines; windows, the contract's max_running, down backends, the token cap."""

from __future__ import annotations

import asyncio

from gateway_parts_helpers import Clock, backends, book_for, bound_policy, cancel_all, job
from tokenfair.core.request import Status
from tokenfair.serve.gateway_dispatch import Dispatcher


def test_dispatcher_fills_windows_least_loaded_first_and_skips_down_backends(h):
    contract = h.service_contract()
    policy = bound_policy(contract)
    bs = backends(3, window=2.0)
    bs[2].up = False
    book, _, _, _ = book_for(bs)
    launched, max_running = [], [3]

    async def proxied(j, b):
        launched.append((j.req.request_id, b.name))
        await asyncio.sleep(3600)

    d = Dispatcher(policy, bs, book, max_inflight_tokens=None, max_running=lambda: max_running[0], now=Clock(),
                   launch=proxied, on_done=book.proxy_done)

    async def scenario():
        for i in range(1, 7):
            j = job(contract, tenant="ab"[i % 2], rid=f"r{i}")
            j.req.status, j.req.predicted_output = Status.WAITING, 4
            policy.enqueue(j.req, 0.0)
            book.add(j)
        d.dispatch_round()                              # max_running 3 of the 4 window slots
        await asyncio.sleep(0)
        first = list(launched)
        max_running[0] = 10                             # a live contract change: read every round
        d.dispatch_round()
        await asyncio.sleep(0)
        await cancel_all(book)
        return first

    first = asyncio.run(scenario())
    assert len(first) == 3 and [n for _, n in first] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000"]
    assert len(launched) == 4 and policy.num_waiting() == 2                # both windows full, 3rd is down
    assert {n for _, n in launched} == {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert d.sleep_s <= 0.05                                              # requests wait: poll soon


def test_dispatcher_caps_predicted_tokens_per_backend(h):
    contract = h.service_contract()
    policy = bound_policy(contract)
    bs = backends(1, window=8.0)
    book, _, _, _ = book_for(bs)

    async def proxied(j, b):
        await asyncio.sleep(3600)

    d = Dispatcher(policy, bs, book, max_inflight_tokens=40, max_running=lambda: 100, now=Clock(),
                   launch=proxied, on_done=book.proxy_done)

    async def scenario():
        for i in range(1, 5):
            j = job(contract, rid=f"r{i}", prompt_tokens=16)
            j.req.status, j.req.predicted_output = Status.WAITING, 4
            policy.enqueue(j.req, 0.0)
            book.add(j)
        d.dispatch_round()
        n = len(book.running)
        await cancel_all(book)
        return n

    n = asyncio.run(scenario())
    per = 16 + 4                                          # prompt + predicted output (max_tokens 4)
    assert n == 40 // per == 2 and policy.num_waiting() == 4 - n
    assert bs[0].inflight == 0 and bs[0].inflight_tokens == 0           # the cancelled tasks gave them back
