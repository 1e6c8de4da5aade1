"""The Lua scripts that are the only writers of a fleet's Redis state (each runs atomically).

Keys, all under the prefix ``tf:{fleet}`` (``P``)::

  P:S         hash   tenant -> tag S (normalised service, cost / weight)
  P:V         string the fleet's virtual time V (monotone)
  P:w         hash   tenant -> weight (as the last dispatching gateway's contract says)
  P:bk, P:bt  hashes tenant -> token-bucket level (cost units) and when it was computed
  P:blk       hash   tenant -> until when it is blocked by its rate limit / concurrency cap
  P:lb:{b}    zset   leases on backend b -> expiry time
  P:lt:{t}    zset   leases of tenant t -> expiry time
  P:backends  set    backend names seen
  P:charged, P:served, P:dispatched, P:completed
              hashes tenant -> predicted cost charged / actual cost served / counts
  P:svc       hash   tenant -> service: predicted cost at dispatch, corrected to the actual
              cost at completion (what the shared recent shares are computed from)
  P:svck      hash   class -> the same per class
  P:served_tc, P:dispatched_tc
              hashes "tenant|class" -> actual cost served / dispatches
  P:op:{id}   string an applied op (a dispatch kept 6 h, a completion 1 h): a replayed op is
              applied once; a completion whose dispatch was never applied is skipped
  P:gw        zset   gateway -> last heartbeat time
  P:q:{g}     hash   tenant -> waiting requests at gateway g (expires with g's heartbeat)
  P:gwinfo    hash   gateway -> "contract|running|time"
  P:contract  string the fleet's live contract tag (version@hash; ``sync_scripts.py``)
  P:contract_text, P:contract_seq
              string the live contract as JSON, and a counter bumped at every publication
  P:qc:{g}    hash   tenant -> predicted cost waiting at gateway g (expires with g's view)
  P:wantwake  string set (for a lease TTL) by every refused dispatch: some gateway waits
  channel P:wake     a dispatch or completion happened while P:wantwake is set (message:
                     "backend|leases on it"), or a contract was published ("contract|seq")

The scripts name their keys through ARGV (the prefix), which standalone Redis allows (not
Redis Cluster).  Times are Redis ``TIME`` (one clock for every gateway) unless a test passes
``now``.  Replies: floats as ``%.17g`` strings, the tags as HGETALL's flat list at the end.
"""

from __future__ import annotations

COMMON = r"""
local P = ARGV[1]
local function num(x, d) local v = tonumber(x); if v == nil then return d end; return v end
local function fmt(x) return string.format('%.17g', x) end
local function now_s(arg)
  local n = tonumber(arg)
  if n ~= nil and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function with_tags(out)
  for _, x in ipairs(redis.call('HGETALL', P .. ':S')) do out[#out + 1] = x end
  return out
end
local function wake(backend, lb)
  -- only while some gateway waits for room (a refusal in the last lease TTL): unsaturated,
  -- a dispatch or completion sends nobody a message
  if redis.call('EXISTS', P .. ':wantwake') == 1 then
    redis.call('PUBLISH', P .. ':wake', backend .. '|' .. redis.call('ZCARD', lb))
  end
end
local function bucket_level(tenant, rate, burst, now)
  local b = tonumber(redis.call('HGET', P .. ':bk', tenant))
  local bt = tonumber(redis.call('HGET', P .. ':bt', tenant))
  if b == nil or bt == nil then return burst end
  return math.min(burst, b + math.max(0, now - bt) * rate)
end
"""

# ARGV: P op lease gw tenant weight cost_pred cost_max rate burst max_conc backend window
#       lease_ttl credit force now class check_ahead backlog...
DISPATCH = COMMON + r"""
local op, lease, gw, tenant = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local w, cpred, cmax = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local rate, burst, maxc = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local backend, window, ttl, credit = ARGV[12], tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local force = ARGV[16] == '1'
local now = now_s(ARGV[17])
local opkey = P .. ':op:' .. op
local lb, lt = P .. ':lb:' .. backend, P .. ':lt:' .. tenant
if redis.call('EXISTS', opkey) == 1 then
  return with_tags({'dup', '', fmt(num(redis.call('GET', P .. ':V'), 0)), redis.call('ZCARD', lb), '0'})
end
redis.call('ZREMRANGEBYSCORE', lb, '-inf', now)
redis.call('ZREMRANGEBYSCORE', lt, '-inf', now)
local V = num(redis.call('GET', P .. ':V'), 0)
local S = math.max(num(redis.call('HGET', P .. ':S', tenant), 0), V - credit / w)
local level = 0
if rate > 0 then level = bucket_level(tenant, rate, burst, now) end
local function refuse(reason, retry)
  redis.call('SET', P .. ':wantwake', '1', 'PX', math.floor(ttl * 1000))
  return with_tags({'refused', reason, fmt(V), redis.call('ZCARD', lb), fmt(retry)})
end
if not force then
  if redis.call('ZCARD', lb) >= window then return refuse('window', 0) end
  if maxc > 0 and redis.call('ZCARD', lt) >= maxc then
    redis.call('HSET', P .. ':blk', tenant, fmt(now + ttl))
    return refuse('concurrency', 0)
  end
  if rate > 0 and level < 0 then
    redis.call('HSET', P .. ':blk', tenant, fmt(now - level / rate))
    return refuse('rate', -level / rate)
  end
  local vb = -math.huge
  if ARGV[19] == '1' then vb = S end
  local seen = {[tenant] = true}
  local function consider(j)
    if seen[j] then return end
    seen[j] = true
    if ARGV[19] ~= '1' then return end
    local blocked = tonumber(redis.call('HGET', P .. ':blk', j))
    if blocked ~= nil and blocked > now then return end
    local wj = num(redis.call('HGET', P .. ':w', j), 1)
    local sj = math.max(num(redis.call('HGET', P .. ':S', j), 0), V - credit / wj)
    if sj < vb then vb = sj end
  end
  for i = 20, #ARGV do consider(ARGV[i]) end
  for _, g in ipairs(redis.call('ZRANGE', P .. ':gw', 0, -1)) do
    if g ~= gw then
      for _, j in ipairs(redis.call('HKEYS', P .. ':q:' .. g)) do consider(j) end
    end
  end
  if ARGV[19] == '1' then
    if S > vb + cpred / w then return refuse('ahead', 0) end
    if vb > V then V = vb end
  end
end
S = S + cpred / w
redis.call('HSET', P .. ':S', tenant, fmt(S))
redis.call('SET', P .. ':V', fmt(V))
redis.call('HSET', P .. ':w', tenant, fmt(w))
if rate > 0 then
  redis.call('HSET', P .. ':bk', tenant, fmt(level - cmax))
  redis.call('HSET', P .. ':bt', tenant, fmt(now))
end
redis.call('ZADD', lb, now + ttl, lease)
redis.call('ZADD', lt, now + ttl, lease)
redis.call('SADD', P .. ':backends', backend)
redis.call('HINCRBYFLOAT', P .. ':charged', tenant, cpred)
redis.call('HINCRBYFLOAT', P .. ':svc', tenant, cpred)
redis.call('HINCRBYFLOAT', P .. ':svck', ARGV[18], cpred)
redis.call('HINCRBY', P .. ':dispatched', tenant, 1)
redis.call('HINCRBY', P .. ':dispatched_tc', tenant .. '|' .. ARGV[18], 1)
redis.call('HDEL', P .. ':blk', tenant)
redis.call('SET', opkey, '1', 'EX', 21600)
wake(backend, lb)
return with_tags({'ok', '', fmt(V), redis.call('ZCARD', lb), '0'})
"""

# ARGV: P op lease tenant weight backend cost_pred cost_max cost_actual rate burst credit now
#       dispatch_op (the completion is skipped, and marked applied, if that op was never applied) class
COMPLETE = COMMON + r"""
local op, lease, tenant = ARGV[2], ARGV[3], ARGV[4]
local w, backend = tonumber(ARGV[5]), ARGV[6]
local cpred, cmax, actual = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local rate, burst, credit = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local now = now_s(ARGV[13])
local opkey = P .. ':op:' .. op
local lb = P .. ':lb:' .. backend
-- expired leases leave before any count is taken (as in DISPATCH and HEARTBEAT)
redis.call('ZREMRANGEBYSCORE', lb, '-inf', now)
redis.call('ZREMRANGEBYSCORE', P .. ':lt:' .. tenant, '-inf', now)
local V = num(redis.call('GET', P .. ':V'), 0)
if redis.call('EXISTS', opkey) == 1 then
  return with_tags({'dup', '', fmt(V), redis.call('ZCARD', lb), '0'})
end
if ARGV[14] ~= nil and ARGV[14] ~= '' and redis.call('EXISTS', P .. ':op:' .. ARGV[14]) == 0 then
  redis.call('SET', opkey, '1', 'EX', 3600)
  return with_tags({'skip', '', fmt(V), redis.call('ZCARD', lb), '0'})
end
local S = num(redis.call('HGET', P .. ':S', tenant), 0)
local delta = (actual - cpred) / w
if delta >= 0 then S = S + delta else S = math.max(S + delta, math.min(S, V - credit / w)) end
redis.call('HSET', P .. ':S', tenant, fmt(S))
if rate > 0 then
  local level = math.min(burst, bucket_level(tenant, rate, burst, now) + cmax - actual)
  redis.call('HSET', P .. ':bk', tenant, fmt(level))
  redis.call('HSET', P .. ':bt', tenant, fmt(now))
end
redis.call('ZREM', lb, lease)
redis.call('ZREM', P .. ':lt:' .. tenant, lease)
redis.call('HINCRBYFLOAT', P .. ':served', tenant, actual)
redis.call('HINCRBYFLOAT', P .. ':svc', tenant, actual - cpred)
redis.call('HINCRBYFLOAT', P .. ':svck', ARGV[15] or '', actual - cpred)
redis.call('HINCRBYFLOAT', P .. ':served_tc', tenant .. '|' .. (ARGV[15] or ''), actual)
redis.call('HINCRBY', P .. ':completed', tenant, 1)
redis.call('HDEL', P .. ':blk', tenant)
redis.call('SET', opkey, '1', 'EX', 3600)
wake(backend, lb)
return with_tags({'ok', '', fmt(V), redis.call('ZCARD', lb), '0'})
"""

# ARGV: P gw ttl lease_ttl contract running now reassert nq (tenant count)*nq (lease backend tenant)*
# Leases are renewed only where they exist (ZADD XX: a lease completed while this heartbeat
# was on its way is not brought back), except with reassert = 1 (after a resync: leases
# that expired while Redis was away are held again).
HEARTBEAT = COMMON + r"""
local gw, ttl, lttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local contract, running = ARGV[5], ARGV[6]
local now = now_s(ARGV[7])
local mode = 'XX'
if ARGV[8] == '1' then mode = 'GT' end
local nq = tonumber(ARGV[9])
redis.call('ZADD', P .. ':gw', now, gw)
redis.call('ZREMRANGEBYSCORE', P .. ':gw', '-inf', now - 600)
local qk = P .. ':q:' .. gw
redis.call('DEL', qk)
for i = 0, nq - 1 do redis.call('HSET', qk, ARGV[10 + 2 * i], ARGV[11 + 2 * i]) end
if nq > 0 then redis.call('PEXPIRE', qk, math.floor(ttl * 1000)) end
redis.call('HSET', P .. ':gwinfo', gw, contract .. '|' .. running .. '|' .. fmt(now))
redis.call('SETNX', P .. ':contract', contract)
local i = 10 + 2 * nq
while i + 2 <= #ARGV do
  redis.call('ZADD', P .. ':lb:' .. ARGV[i + 1], mode, now + lttl, ARGV[i])
  redis.call('ZADD', P .. ':lt:' .. ARGV[i + 2], mode, now + lttl, ARGV[i])
  redis.call('SADD', P .. ':backends', ARGV[i + 1])
  i = i + 3
end
local out = {redis.call('ZCOUNT', P .. ':gw', now - ttl, '+inf'),
             fmt(num(redis.call('GET', P .. ':V'), 0)),
             redis.call('GET', P .. ':contract') or ''}
local backends = redis.call('SMEMBERS', P .. ':backends')
out[#out + 1] = #backends
for _, b in ipairs(backends) do
  redis.call('ZREMRANGEBYSCORE', P .. ':lb:' .. b, '-inf', now)
  out[#out + 1] = b
  out[#out + 1] = redis.call('ZCARD', P .. ':lb:' .. b)
end
return with_tags(out)
"""
