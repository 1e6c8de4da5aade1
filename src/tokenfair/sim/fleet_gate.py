"""The fair gateway in front of a simulated fleet: ``tokenfair gateway``'s layers 1-3, run
through the gateway's own dispatch code (``sched/gateway_round.py``).

  arrival   ``sched/arrival.arrive``: ``on_arrival`` (429-style rejection) then ``enqueue``
            into the gateway's policy;
  dispatch  a round (``begin_round`` + ``release_round``) at every arrival, every time a
            replica starts or ends a request the gateway released, and at the policy's
            wake-up: while a replica has room in its window, the policy picks the next
            request and the router picks the replica among those with room; the replica gets
            a fresh request for the same trace row;
  locality  with ``locality_hold_s`` > 0: a request goes to the replica whose prefix cache
            holds the most of its prompt (at least ``LOCALITY_MIN_FRACTION``) when that
            replica has room, whatever the router says; when it has none, the request is held
            back (``release_round``'s ``holds``: its tenant is skipped for the round, the
            others go on) until the holder has room or ``locality_hold_s`` has passed since it
            was first held, then it goes wherever the router sends it.  So a request waits at
            most ``locality_hold_s`` more than it would without the hold, and the hold never
            gives its tenant more than the fair order does.  (``tokenfair gateway`` cannot
            see its backends' prefix caches and holds nothing.)
  window    per replica, the gateway's default (``sched/backend_window.py``, the code
            ``tokenfair gateway`` runs): saturation-driven, from a reading of the replica's
            queue, running count and KV use at the first round ``poll_s`` after the last
            (the real gateway polls vLLM's /metrics that often), and the prefill backlog
            bound (prompt tokens released without a first token); or, with a fixed
            ``window``, that many requests released and not ended;
  progress  the replica's first token is reported after the replica's turn that made it
            (``on_served`` with the prompt charge and one token, as the proxy does); the
            other output tokens are reported together when the request ends (the proxy
            reports each streamed token), then ``on_finish`` settles the predicted charge, and
            the gateway's time per output token (an EWMA, weight ``TPOT_EWMA_WEIGHT``) feeds
            ``expire``.

Prefix cache charge (the stated rule): a released request's prompt is charged as
``uncached + ceil(cached_discount x cached)`` tokens, ``cached`` being the prompt tokens the
replica's prefix cache held (as a gateway reads ``usage.prompt_tokens_details.cached_tokens``);
NVIDIA Dynamo's router charges uncached input only (a discount of 0).  Per-replica policies
see the scheduler's token counts and charge cached tokens in full.
The gateway's contract is the replicas' scaled to the fleet (as an operator configures the
gateway): ``engine.max_running`` = window x replicas, ``max_long_prefills_per_tenant`` x
replicas.  Not modelled: the gateway's token-bucket door check, retries, backend failures.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.reasons import Reason
from ..core.request import Request, Status
from ..sched import arrival
from ..sched.backend_window import Saturation, SaturationConfig, SaturationWindow, WindowConfig
from ..sched.gateway_round import begin_round, release_round
from ..sched.policy import end_each_waiting
from ..sched.predictor import OnlinePredictor
from ..sched.registry import make_policy
from .replica import Replica
from .routers import Router

TPOT_EWMA_WEIGHT = 0.1          # the gateway's per-backend EWMA weight (gateway_backend)
UNBOUNDED_BLOCKS = 1 << 36      # the gateway holds no KV
LOCALITY_MIN_FRACTION = 0.5    # a replica holding this much of a prompt is worth waiting for
IDLE_POLL_S = 0.05              # the gateway's poll while requests wait (gateway_dispatch)


class FleetGate:
    def __init__(self, policy: str, contract: Contract, profile: Profile, num_replicas: int,
                 window: int | None, cached_discount: float, locality_hold_s: float = 0.0) -> None:
        """``window``: a fixed window per replica, or None for the gateway's default
        (saturation-driven, at most ``engine.max_running``)."""
        self.window = window
        max_window = contract.engine.max_running if window is None else window
        self.max_running = max_window * num_replicas
        self.windows = None if window is not None else [
            SaturationWindow(WindowConfig(max=float(max_window)), SaturationConfig()) for _ in range(num_replicas)]
        self.cached_discount = cached_discount
        self.locality_hold_s = locality_hold_s
        # requests held back for the replica holding their prefix: seq -> (when first held, request)
        self.held: dict[int, tuple[float, Request]] = {}
        # the replicas' contract scaled to the fleet, as an operator sets the gateway's
        engine = contract.engine.model_copy(update={
            "max_running": self.max_running,
            "max_long_prefills_per_tenant": contract.engine.max_long_prefills_per_tenant * num_replicas})
        self.contract = contract.model_copy(update={"engine": engine})
        self.policy = make_policy(policy)
        self.predictor = OnlinePredictor()
        self.policy.bind(self.contract, profile, BlockPool(UNBOUNDED_BLOCKS, profile.block_size), self.predictor)
        self.num_running = 0
        self.last_round_s = 0.0
        self.tpot_ewma_s: float | None = None
        self.wake_s = math.inf
        # per replica: (gateway request, replica request, cached prompt tokens) released to it
        # and not ended; ``unstarted``: those of them without a first token yet
        self.pending: list[list[tuple[Request, Request, int]]] = [[] for _ in range(num_replicas)]
        self.unstarted: list[list[tuple[Request, Request, int]]] = [[] for _ in range(num_replicas)]

    # -- arrival --------------------------------------------------------------------------------
    def arrive(self, req: Request, now: float) -> None:
        reason = arrival.arrive(self.policy, self.predictor, req, now)
        if reason is not None:
            self._end(req, Status.REJECTED, reason, now)

    def _end(self, req: Request, status: Status, reason: Reason, now: float) -> None:
        req.status, req.end_reason, req.finish_s = status, reason, now
        if req.scheduled_s is not None:
            self.policy.on_finish(req, now)

    # -- a dispatch round -----------------------------------------------------------------------
    def dispatch(self, now: float, replicas: Sequence[Replica], router: Router,
                 hashes_of: Callable[[Request], Sequence[int]],
                 release: Callable[[Request, Replica, float], Request]) -> None:
        """One round at ``now``; ``release(gateway_request, replica, now)`` hands the trace row
        to the replica and returns the replica's request."""
        expired, self.last_round_s = begin_round(self.policy, now, self.last_round_s, self.tpot_ewma_s)
        for req, reason in expired:
            self._end(req, Status.EXPIRED, reason, now)
        if self.windows is not None:
            self._read_replicas(replicas, now)
        limits = [self.window] * len(replicas) if self.windows is None else [w.limit for w in self.windows]

        def has_room(r: Replica, req: Request | None) -> bool:
            if len(self.pending[r.index]) >= limits[r.index]:
                return False
            return req is None or self.windows is None or self._admits_prompt(r.index, req.prompt_tokens, now)

        # (candidate, its holder) as ``holds`` found it: ``choose`` asks next about the same
        # candidate, and nothing is released in between (performance: one scan of the caches)
        last: list[tuple[Request, Replica | None]] = []

        def holder_of(req: Request) -> Replica | None:
            if not (last and last[0][0] is req):
                last[:] = [(req, self._holder(req, replicas, hashes_of))]
            return last[0][1]

        def choose(req: Request | None, tokens: int) -> Replica | None:
            room = [r for r in replicas if has_room(r, req)]
            if not room:
                return None
            if req is None:
                return room[0]
            holder = holder_of(req)
            if holder is not None and has_room(holder, req):
                return holder
            return replicas[router.choose(room, hashes_of(req))]

        def holds(req: Request) -> bool:
            holder = holder_of(req)
            if holder is None or has_room(holder, req):
                return False
            since = self.held.setdefault(req.seq, (now, req))[0]
            return now - since < self.locality_hold_s

        def hand_over(req: Request, replica: Replica, tokens: int) -> None:
            self.held.pop(req.seq, None)
            last.clear()                      # its blocks enter the replica's cache
            rr = release(req, replica, now)
            cached = replica.engine.cached_tokens.get(rr, 0)
            self.pending[replica.index].append((req, rr, cached))
            self.unstarted[replica.index].append((req, rr, cached))

        self.num_running = release_round(self.policy, now, self.num_running, self.max_running, choose, hand_over,
                                         holds if self.locality_hold_s > 0 else None)
        wake = self.policy.next_wakeup(now) if self.policy.num_waiting() else math.inf
        if self.held:
            wake = min(wake, self._next_hold_end(now))
        self.wake_s = max(wake, now + IDLE_POLL_S) if wake < math.inf else wake

    def _next_hold_end(self, now: float) -> float:
        """When the next held request's hold ends (inf: none still to end); forgets the held
        requests that no longer wait (expired).  O(held)."""
        self.held = {seq: (since, req) for seq, (since, req) in self.held.items() if req.status is Status.WAITING}
        ends = [since + self.locality_hold_s for since, _ in self.held.values()]
        return min((t for t in ends if t > now), default=math.inf)

    def _holder(self, req: Request, replicas: Sequence[Replica],
                hashes_of: Callable[[Request], Sequence[int]]) -> Replica | None:
        """The replica whose prefix cache holds the most of ``req``'s prompt, when that is at
        least ``LOCALITY_MIN_FRACTION`` of it (None: no replica does; ties: lowest index)."""
        if self.locality_hold_s <= 0:
            return None
        hashes = hashes_of(req)
        if not hashes:
            return None
        best, best_blocks = None, 0
        for r in replicas:
            b = r.cached_prefix(hashes)
            if b > best_blocks:
                best, best_blocks = r, b
        if best is None or best_blocks < LOCALITY_MIN_FRACTION * len(hashes):
            return None
        return best

    # -- the windows ------------------------------------------------------------------------------
    def _read_replicas(self, replicas: Sequence[Replica], now: float) -> None:
        """What the gateway's poller does, for each replica whose last reading is ``poll_s``
        old: read its queue, running count and KV use, and apply it to its window."""
        assert self.windows is not None
        for r in replicas:
            w = self.windows[r.index]
            if now >= w.next_poll_s:
                w.next_poll_s = now + w.sat.poll_s
                reading = Saturation(float(r.sched.policy.num_waiting()), float(len(r.sched.running)),
                                     r.kv_usage(), now)
                w.on_reading(reading, len(self.pending[r.index]))

    def _admits_prompt(self, index: int, prompt_tokens: int, now: float) -> bool:
        assert self.windows is not None
        backlog = sum(gw.prompt_tokens for gw, _, _ in self.unstarted[index])
        return self.windows[index].admits_prompt(backlog, prompt_tokens, now)

    # -- outcomes ---------------------------------------------------------------------------------
    def collect(self, replica: Replica, now: float) -> int:
        """Report the first tokens ``replica`` produced and settle the requests it ended since
        the last call; returns how many started or ended (a reason for a dispatch round).
        O(released requests without a first token), plus O(released) when one ended."""
        waiting = self.unstarted[replica.index]
        num_started = 0
        if waiting:
            still = []
            for entry in waiting:
                gw, rr, cached = entry
                if rr.first_token_s is not None:
                    self._first_token(gw, rr, cached, now)
                    num_started += 1
                elif not rr.status.is_terminal:
                    still.append(entry)
            self.unstarted[replica.index] = still
        pending = self.pending[replica.index]
        if replica.load() >= len(pending):
            return num_started                # every released request is still waiting or running
        kept = []
        num_ended = 0
        for gw, rr, cached in pending:
            if rr.status.is_terminal:
                self._settle(gw, rr, cached, now)
                num_ended += 1
            else:
                kept.append((gw, rr, cached))
        self.pending[replica.index] = kept
        self.num_running -= num_ended
        return num_started + num_ended

    def _first_token(self, gw: Request, rr: Request, cached: int, now: float) -> None:
        """As the gateway's proxy does on a first streamed token: the prompt is served."""
        gw.first_token_s = rr.first_token_s
        gw.num_computed = gw.prompt_tokens + 1
        gw.num_output = 1
        prompt = gw.prompt_tokens - cached + math.ceil(self.cached_discount * cached)
        self.policy.on_served(gw, prompt, 1, now)

    def _settle(self, gw: Request, rr: Request, cached: int, now: float) -> None:
        if rr.first_token_s is not None and gw.first_token_s is None:
            self._first_token(gw, rr, cached, now)
        more = rr.num_output - gw.num_output
        gw.num_output, gw.num_computed = rr.num_output, rr.num_computed
        gw.status, gw.end_reason, gw.finish_s = rr.status, rr.end_reason, rr.finish_s
        if more > 0:
            self.policy.on_served(gw, 0, more, now)   # the streamed tokens, reported at the end
        if rr.first_token_s is not None and rr.finish_s is not None and rr.num_output > 1:
            tpot = (rr.finish_s - rr.first_token_s) / (rr.num_output - 1)
            e = self.tpot_ewma_s
            self.tpot_ewma_s = tpot if e is None else e + TPOT_EWMA_WEIGHT * (tpot - e)
        if rr.status is Status.FINISHED:
            self.predictor.observe(gw, gw.num_output)
        self.policy.on_finish(gw, now)

    def fail_waiting(self, reason: Reason, now: float) -> None:
        """Nothing can ever release what still waits: end it with ``reason``."""
        end_each_waiting(self.policy, now, lambda req: self._end(req, Status.FAILED, reason, now))
