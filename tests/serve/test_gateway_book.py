"""The gateway's job book built alone (no Gateway): one terminal state per job, retries,
and what a proxy task's end does to its job."""

from __future__ import annotations

import asyncio

from gateway_parts_helpers import backends, book_for, job
from tokenfair.core.reasons import Reason, ReasonCode
from tokenfair.core.request import Status
from tokenfair.serve.jobs import Failed


def test_book_ends_a_job_once_records_it_and_scrubs_backend_addresses(h):
    bs = backends(1)
    book, records, _, wakes = book_for(bs)
    j = job(h.service_contract())
    j.req.scheduled_s = 0.0
    book.add(j)
    book.end(j, Status.FAILED, Reason(ReasonCode.BACKEND_ERROR, "x"), Failed(502, f"{bs[0].url} broke", "backend_error"),
             http_status=502)
    book.end(j, Status.FINISHED, Reason(ReasonCode.COMPLETED, "again"))                       # a second end does nothing
    assert not book.jobs and j.ended and j.req.status is Status.FAILED
    assert records == [("r1", Status.FAILED, {"endpoint": "completion", "finish_reason": None, "http_status": 502})]
    assert book.policy.calls == [("on_finish", "r1")] and wakes == [1]
    ev = j.q.get_nowait()
    assert isinstance(ev, Failed) and ev.message == "backend 1 broke" and j.finished.is_set()


def test_book_lets_a_job_go_only_after_its_record_is_written(h):
    """Another thread (a test, a drain) that sees no held jobs must see every record."""
    from tokenfair.serve.gateway_jobs import JobBook

    held_at_record: list[bool] = []
    book = JobBook(None, None, backends(1), max_retries=0, now=lambda: 1.0,
                   record=lambda req, **kw: held_at_record.append(req.request_id in book.jobs),
                   preempted=lambda t: None, closing=lambda: False, wake=lambda: None)
    j = job(h.service_contract())
    book.add(j)
    book.end(j, Status.FAILED, Reason(ReasonCode.CLIENT_DISCONNECTED, "gone"))
    assert held_at_record == [True] and not book.jobs


def test_book_requeues_within_max_retries_then_fails(h):
    bs = backends(1)
    book, records, preempted, _ = book_for(bs, max_retries=1)
    j = job(h.service_contract())
    j.req.status = Status.RUNNING
    book.add(j)
    book.running.add(j)
    book.requeue_or_fail(j, bs[0], Reason(ReasonCode.BACKEND_STATUS, "503"), 503)
    assert j.req.status is Status.WAITING and j.retries == 1 and j.req.num_preemptions == 1
    assert j not in book.running and preempted == ["a"] and book.policy.calls == [("enqueue", "r1")]
    book.requeue_or_fail(j, bs[0], Reason(ReasonCode.BACKEND_STATUS, "503"), 503)            # retries spent
    assert j.req.status is Status.FAILED and records[0][2]["http_status"] == 503
    ev = j.q.get_nowait()
    assert isinstance(ev, Failed) and ev.status == 503 and ev.code == "backend_status"
    closing_book, _, _, _ = book_for(bs, closing=True)                   # stopping: never re-queued
    k = job(h.service_contract(), rid="r2")
    closing_book.add(k)
    closing_book.requeue_or_fail(k, bs[0], Reason(ReasonCode.BACKEND_UNAVAILABLE, "gone"), 503)
    assert k.req.status is Status.FAILED and k.retries == 0


def test_book_proxy_done_frees_the_slot_and_ends_by_how_the_task_ended(h):
    contract = h.service_contract()
    bs = backends(1)
    book, _, _, _ = book_for(bs)

    async def never():
        await asyncio.sleep(3600)

    async def crash():
        raise RuntimeError("boom")

    async def scenario():
        out = {}
        for rid, coro, requeue in (("r1", never, True), ("r2", never, False), ("r3", crash, False)):
            j = job(contract, rid=rid)
            j.req.status = Status.RUNNING
            book.add(j)
            book.running.add(j)
            b = bs[0]
            j.backend = b
            b.inflight, b.inflight_tokens = 1, 10
            j.task = asyncio.ensure_future(coro())
            await asyncio.sleep(0)
            if requeue:
                book.drain_backend(b, Reason(ReasonCode.BACKEND_UNAVAILABLE, "backend 1 stopped answering (x)"))
            elif coro is never:
                j.cancel_reason = Reason(ReasonCode.CLIENT_DISCONNECTED, "gone")
                j.task.cancel()
            await asyncio.gather(j.task, return_exceptions=True)
            book.proxy_done(j, b, 10, j.task)
            assert b.inflight == 0 and b.inflight_tokens == 0 and j not in book.running
            out[rid] = (j.req.status, j.req.reason, j.retries)
        return out

    out = asyncio.run(scenario())
    assert out["r1"][0] is Status.WAITING and out["r1"][2] == 1            # re-queued for another backend
    assert out["r2"] == (Status.FAILED, "client_disconnected: gone", 0)
    assert out["r3"] == (Status.FAILED, "gateway_error: RuntimeError: boom", 0)
