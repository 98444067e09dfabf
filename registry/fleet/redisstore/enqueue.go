package redisstore

// queueAdmitLua is the queue's part that only the acquire script uses
// (after queueLua): the scripts that release and abandon leave it out, as
// each function a script defines costs every run of it.
const queueAdmitLua = `
-- earliestOf returns when k's earliest lease expires (0: none): in a
-- grace (see silence.go), not before its end.
local function earliestOf(k)
  local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if first[2] then return math.max(tonumber(first[2]), graceEnd) end
  return 0
end
-- enqueue queues ticket, of units, on each of its keys (kl), numbering
-- its arrival in the fleet's order (P's counter). A flow's start tag in a
-- class is its finish tag there (#f<rank>) or the class's virtual time,
-- whichever is later.
local function enqueue(kl, ticket, units, rank, flow, weight, proc, ttl, P)
  -- A ticket of several keys, or of more than one unit, keeps its keys'
  -- limits as its calls send them (a heavy waiter is heavy by its own).
  local packed
  if #kl > 1 or units > 1 then packed = cjson.encode(kl) end
  local arrival = redis.call('HINCRBY', P, '#arrivals', 1)
  for _, e in ipairs(kl) do
    local Q, T, V = qkeys(e[1])
    local F = e[1] .. '#f' .. rank
    local vt = tonumber(redis.call('HGET', V, 'V|' .. rank)) or 0
    local tag = math.max(vt, tonumber(redis.call('ZSCORE', F, flow)) or 0)
    local step = math.max(1, math.floor(e[2] / turnSteps))
    local finish = math.min(tag + math.ceil(units / step) / weight, maxTag)
    redis.call('ZADD', F, finish, flow)
    local seq = redis.call('HINCRBY', V, 'seq', 1)
    if seq == 1 then
      -- A queue begins (its hash of counts goes when it empties): so does
      -- its summary (see clearBehind). Where the hash went alone (an
      -- eviction), with tickets queued, the summary counts none of them,
      -- and xe tells.
      redis.call('HSET', V, 'xi', 1, 'x', 0, 'xe', redis.call('HLEN', T), 'xs', 0)
    end
    local m = string.format('%d|%020.6f|%012d|%s|%s', rank, tag, seq, proc, ticket)
    local added = redis.call('ZADD', Q, 0, m)
    redis.call('ZADD', e[1] .. '#m', units, ticket)
    local fields = {ticket, m, 'f|' .. ticket, flow, 'a|' .. ticket, arrival, 's|' .. ticket, tag, 'e|' .. ticket, finish}
    if packed then fields[#fields + 1], fields[#fields + 2] = 'k|' .. ticket, packed end
    if units > 1 then fields[#fields + 1], fields[#fields + 2] = 'w|' .. ticket, units end
    local new = redis.call('HSET', T, unpack(fields))
    added = summaryLen * added + new
    -- Whether it counts in the summary (see clearBehind): as marked reads
    -- the fields the walk reads, and those it had already where it had
    -- any (an eviction took the queue and left T: its u| is still read).
    local mark = marked(packed, nil)
    if 2 * new < #fields then
      local f = redis.call('HMGET', T, 'k|' .. ticket, 'u|' .. ticket)
      mark = marked(f[1], f[2])
    end
    if units > 1 then
      redis.call('HINCRBY', V, 'weighted', 1)
      weightedWaiters[e[1]] = true
    end
    redis.call('HINCRBY', V, 'xe', added)
    redis.call('HINCRBY', V, 'xs', 1)
    if mark then redis.call('HINCRBY', V, 'x', 1) end
    redis.call('HINCRBY', V, 'n|' .. flow, 1)
    local cf = rank .. '|' .. flow
    if redis.call('HINCRBY', V, 'n|' .. cf, 1) == 1 then redis.call('HSET', V, 'b|' .. cf, tag) end
  end
end
-- keepQueued keeps the queues of kl from expiring under their waiters.
-- A cover makes every key of the queue live 3 TTLs, and notes when they
-- end in its hash of counts (c in <k>#v): a waiter's call covers them
-- again once less than 2 TTLs are left, and always after it queued (a
-- ticket may add keys). Every other script that makes one of them covers
-- it (passOver, unqueue), so none lives without an expiry. (A process of
-- the release before this one, in a rolling deploy, puts a flow's finish
-- tag back without one: the next full cover, within a TTL, gives it one.)
local function keepQueued(kl, ttl, now, queued)
  for _, e in ipairs(kl) do
    local Q, T, V = qkeys(e[1])
    if queued or (tonumber(redis.call('HGET', V, 'c')) or 0) < now + 2 * ttl then
      redis.call('HSET', V, 'c', now + 3 * ttl)
      cover(Q, 3 * ttl) cover(T, 3 * ttl) cover(V, 3 * ttl) cover(e[1] .. '#u', 3 * ttl) cover(e[1] .. '#m', 3 * ttl)
      for rank = 0, 2 do cover(e[1] .. '#f' .. rank, 3 * ttl) end
    end
  end
end
-- alive renews proc's liveness deadline in P.
local function alive(P, proc, now, ms)
  redis.call('HSET', P, proc, now + ms)
  cover(P, 2 * ms)
end
`
