"""The Lua scripts of the fleet's slow path (``sync.py``): the shared view a gateway reads
every ``heartbeat_s`` (rate buckets, recent service, the queues of the other gateways, the
live contract's tag), and the live contract's publication.  Keys as in ``scripts.py``.
"""

from __future__ import annotations

from .scripts import COMMON

# ARGV: P gw ttl now nq (tenant queued_cost)*nq
# Writes this gateway's queued cost per tenant (P:qc:{gw}, expiring after ttl); returns
#   now, contract tag, contract seq, nt, (tenant, bucket level, bucket time, svc, queued cost
#   at the other live gateways)*nt, nk, (class, svc)*nk
VIEW = COMMON + r"""
local gw, ttl = ARGV[2], tonumber(ARGV[3])
local now = now_s(ARGV[4])
local nq = tonumber(ARGV[5])
local qk = P .. ':qc:' .. gw
redis.call('DEL', qk)
for i = 0, nq - 1 do redis.call('HSET', qk, ARGV[6 + 2 * i], ARGV[7 + 2 * i]) end
if nq > 0 then redis.call('PEXPIRE', qk, math.floor(ttl * 1000)) end
local others, names, seen = {}, {}, {}
local function add(t) if not seen[t] then seen[t] = true; names[#names + 1] = t end end
local svc = redis.call('HGETALL', P .. ':svc')
local svc_of = {}
for i = 1, #svc, 2 do svc_of[svc[i]] = svc[i + 1]; add(svc[i]) end
for _, g in ipairs(redis.call('ZRANGEBYSCORE', P .. ':gw', now - ttl, '+inf')) do
  if g ~= gw then
    local q = redis.call('HGETALL', P .. ':qc:' .. g)
    for i = 1, #q, 2 do
      others[q[i]] = (others[q[i]] or 0) + tonumber(q[i + 1]); add(q[i])
    end
  end
end
local out = {fmt(now), redis.call('GET', P .. ':contract') or '', redis.call('GET', P .. ':contract_seq') or '0',
             #names}
for _, t in ipairs(names) do
  out[#out + 1] = t
  out[#out + 1] = redis.call('HGET', P .. ':bk', t) or ''
  out[#out + 1] = redis.call('HGET', P .. ':bt', t) or ''
  out[#out + 1] = svc_of[t] or '0'
  out[#out + 1] = fmt(others[t] or 0)
end
local per_class = redis.call('HGETALL', P .. ':svck')
out[#out + 1] = #per_class / 2
for _, x in ipairs(per_class) do out[#out + 1] = x end
return out
"""

# ARGV: P tag text only_if_absent
# Makes ``tag`` (version@hash) with its JSON ``text`` the fleet's live contract and bumps
# the sequence; with only_if_absent = 1 (a gateway starting) it leaves a stored contract in
# place.  Returns the live tag, its text and the sequence.
PUBLISH = COMMON + r"""
local tag, text = ARGV[2], ARGV[3]
if ARGV[4] ~= '1' or redis.call('EXISTS', P .. ':contract_text') == 0 then
  redis.call('SET', P .. ':contract', tag)
  redis.call('SET', P .. ':contract_text', text)
  redis.call('INCR', P .. ':contract_seq')
  redis.call('PUBLISH', P .. ':wake', 'contract|' .. redis.call('GET', P .. ':contract_seq'))
end
return {redis.call('GET', P .. ':contract'), redis.call('GET', P .. ':contract_text'),
        redis.call('GET', P .. ':contract_seq')}
"""
