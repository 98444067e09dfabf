package redisstore

import (
	"strconv"

	"github.com/inflight-go/inflight/registry"
)

// The fleet's queue: one order for the waiters of every process on a
// capped key, kept in Redis beside the key's leases, and a hand-off of
// freed capacity to its head. The acquire, release and abandon scripts
// share the Lua below.
//
// A waiter is a ticket: the lease id it will hold. Its place is a member of
// <key>#q, a sorted set whose members all score 0 and so sort by their
// bytes: the priority class's rank, then the start tag of start-time fair
// queuing between flows, then a sequence number, then the ticket's process
// and the ticket. So the head is the first waiter of the highest class,
// the flows of a class take turns in proportion to their weights, and a
// flow's waiters keep their order. A flow's next start tag in a class is
// its finish tag there (its last start tag plus 1/weight, in the sorted
// set <key>#f<rank>) or the class's virtual time (the start tag of its
// last ticket granted, which only moves forward), whichever is later. A
// flow is charged for the turns it is granted: if its waiters in a class
// all leave without a grant, its finish tag there goes back to the finish
// of its last granted turn (or the start of the first of them), and
// finish tags the virtual time has passed are dropped, as they no longer
// count. <key>#t maps each
// queued ticket to its member, its flow, its arrival in the fleet (a
// counter in the liveness hash) and, for a ticket of several keys, all of
// its keys and their limits, which its calls keep up to date; <key>#v
// holds the virtual times, each flow's queued count and the sequence. All
// go when the queue empties, so tags start from 0 after every backlog. A
// grant is a lease of the claim window, listed in <key>#g (scored as its
// lease) until its waiter claims it, so that the counts of a learned
// cap's evidence leave it out.
//
// A ticket of several keys (AcquireAll) is queued on each of them, holds
// nothing while it waits, and is granted by whichever key's turn finds
// room on all of its keys. A grant that passes it over is counted, per
// key; at maxPassed it becomes one of the key's urgent tickets (<key>#u,
// by arrival). The key keeps one place for its oldest urgent ticket, which
// binds only tickets that came after it: so it is served once its other
// keys have room, and the oldest urgent ticket of the fleet is never kept
// out, which rules out a deadlock of kept places across keys. One place,
// however many are urgent: each kept place idles while its ticket waits
// for its other keys, and a place each would let a backlog on a second key
// (a model cap) take the first (the provider's) from everyone else.
//
// Every script that may free capacity on a key, or finds it free, serves
// its queue first (serve): it drops expired leases and, while the key has
// room, grants the first waiter that can take it a lease of the claim
// window's length on each of its keys and publishes its ticket on its
// process's channel (<prefix>{<name>}#wake:<process>), so that only that
// process wakes. The waiter claims its grant by running the acquire script
// again, which extends the lease to the full TTL, unless a key is over the
// limit the waiter has now (the grant was made under a higher one): then
// the grant is given back and served, and the waiter queues again. A
// waiter that died or went slow costs the key at most the claim window; a
// waiter whose process is within 1.5 claim windows of its liveness deadline
// (<prefix>{<name>}#procs, process to deadline in server milliseconds,
// renewed by its waiters' calls, each at least once a claim window) is
// dropped, not granted, so a killed process's tickets delay no one by more
// than the liveness TTL. A newcomer never passes a waiter it has looked at
// that could take the room: it is served first. Serving looks at 64
// waiters from the head; where it stops short with room left, a newcomer
// looks at 64 more, and a waiter further back takes the room on its own
// next call. While new admissions are paused (Redis lost its data) nothing
// is served.

// baseLua is what every script with a time shares.
const baseLua = `
local function nowMS(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A key expires with its latest lease, never sooner: a lease of a
-- process with a longer TTL (a rolling deploy that changes WithLeaseTTL)
-- may be in it.
local function cover(k, ttl)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
-- ungrant takes id off k's grants not claimed yet (<k>#g): its lease on k
-- is held now, or gone. A live member always has its lease, scored alike,
-- so only where a lease may be a grant is it called (a claim, a grant
-- given back or withdrawn, a lease put back); a newcomer's or a release's
-- lease is not one, and an expired member goes with its lease's expiry
-- (admitted and grant drop the expired ones before they count).
local function ungrant(k, id) redis.call('ZREM', k .. '#g', id) end
`

// queueLua is the queue's part of the scripts (after baseLua).
var queueLua = `
local maxPassed, scanMax = ` + strconv.Itoa(registry.MaxPassed) + `, 64
local function qkeys(k) return k .. '#q', k .. '#t', k .. '#v' end
local function earliestOf(k)
  local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return 0
end
-- unqueue takes ticket out of k's queue, with its flow's counts and its
-- place among the urgent, and returns its member there (nil: not queued).
-- A flow's turns in a class are charged from its first waiter queued
-- while it had none there (b|, that waiter's start tag) and as each is
-- granted (b| moves forward to the granted ticket's finish tag, e|): so
-- if its last waiter there leaves without a grant (withdrawn, dropped),
-- its finish tag goes back to b|, and the turns it never used are not
-- charged. A waiter that leaves while others of its flow wait gives its
-- turn back if it was the newest (the flow's finish tag is its own).
local function unqueue(k, ticket, leaving)
  local Q, T, V = qkeys(k)
  local m = redis.call('HGET', T, ticket)
  if not m then return nil end
  redis.call('ZREM', Q, m)
  redis.call('ZREM', k .. '#u', ticket)
  local flow = redis.call('HGET', T, 'f|' .. ticket)
  if flow then
    if redis.call('HINCRBY', V, 'n|' .. flow, -1) <= 0 then redis.call('HDEL', V, 'n|' .. flow) end
    local rank = string.match(m, '^(%d+)|')
    local cf = rank .. '|' .. flow
    local finish = tonumber(redis.call('HGET', T, 'e|' .. ticket))
    if finish and not leaving and finish > (tonumber(redis.call('HGET', V, 'b|' .. cf)) or 0) then
      redis.call('HSET', V, 'b|' .. cf, finish)
    end
    if finish and leaving then
      -- The flow's newest waiter there gives its turn back.
      local F = k .. '#f' .. rank
      local start = tonumber(redis.call('HGET', T, 's|' .. ticket))
      if start and tonumber(redis.call('ZSCORE', F, flow)) == finish then redis.call('ZADD', F, start, flow) end
    end
    if redis.call('HINCRBY', V, 'n|' .. cf, -1) <= 0 then
      local base = redis.call('HGET', V, 'b|' .. cf)
      if leaving and base then
        redis.call('ZADD', k .. '#f' .. rank, base, flow)
      end
      redis.call('HDEL', V, 'n|' .. cf, 'b|' .. cf)
    end
  end
  redis.call('HDEL', T, ticket, 'f|' .. ticket, 'k|' .. ticket, 'p|' .. ticket, 'a|' .. ticket, 'e|' .. ticket, 's|' .. ticket)
  if redis.call('EXISTS', Q) == 0 then
    redis.call('DEL', T, V, k .. '#u', k .. '#f0', k .. '#f1', k .. '#f2')
  end
  return m
end
-- ticketKeys returns the {key, limit} pairs of a ticket queued on k,
-- whose limit there is at most limit.
local function ticketKeys(T, ticket, k, limit)
  local packed = redis.call('HGET', T, 'k|' .. ticket)
  if not packed then return {{k, limit}} end
  local kl = cjson.decode(packed)
  for _, e in ipairs(kl) do
    if e[1] == k then e[2] = math.min(e[2], limit) end
  end
  return kl
end
-- dead reports whether the process of a queued ticket (its member m) is
-- gone: within one and a half claim windows of its liveness deadline, it
-- has not renewed for that long (its waiters ask at least once a claim
-- window). Dropped then, its waiters delay the others by less than its
-- liveness TTL: the time left, and at most a claim window until the next
-- waiter asks.
local function dead(P, m, now, claim)
  local proc = string.match(m, '|([^|]*)|[^|]+$')
  local alive = tonumber(redis.call('HGET', P, proc))
  if alive and alive <= now then redis.call('HDEL', P, proc) end
  return not alive or alive <= now + 1.5 * claim
end
-- drop takes ticket, queued on k with limit, out of all its keys' queues.
local function drop(k, limit, ticket)
  for _, e in ipairs(ticketKeys(k .. '#t', ticket, k, limit)) do unqueue(e[1], ticket, true) end
end
-- roomFor returns the places k has, under limit, for ticket, which arrived
-- at arrival (both nil: a newcomer): its free capacity, less the place
-- kept for k's oldest urgent ticket unless that is ticket or came later.
-- An urgent ticket no longer queued, or whose process is dead, is dropped
-- first.
local function roomFor(k, limit, ticket, arrival, now, P, claim)
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  local free = limit - redis.call('ZCARD', k)
  if free <= 0 then return free end
  for _ = 1, scanMax do
    local oldest = redis.call('ZRANGE', k .. '#u', 0, 0, 'WITHSCORES')
    if not oldest[1] then return free end
    local m = redis.call('HGET', k .. '#t', oldest[1])
    if not m then
      redis.call('ZREM', k .. '#u', oldest[1])
    elseif dead(P, m, now, claim) then
      drop(k, limit, oldest[1])
    else
      if oldest[1] ~= ticket and (not arrival or tonumber(oldest[2]) < arrival) then free = free - 1 end
      return free
    end
  end
  return free - 1
end
-- passOver counts a grant on k that passed ticket over: at maxPassed it is
-- one of k's urgent tickets, by arrival.
local function passOver(k, ticket)
  local Q, T = qkeys(k)
  if redis.call('HINCRBY', T, 'p|' .. ticket, 1) == maxPassed then
    local U = k .. '#u'
    redis.call('ZADD', U, tonumber(redis.call('HGET', T, 'a|' .. ticket)) or 0, ticket)
    cover(U, redis.call('PTTL', Q))
  end
end
-- grant gives ticket a lease of the claim window on each of its keys
-- (kl), takes it out of their queues, moving each class's virtual time to
-- its start tag there (and forgetting the finish tags of flows it has
-- passed: their next start is the virtual time anyway), and wakes its
-- process.
local function grant(kl, ticket, proc, now, claim, chans)
  for _, e in ipairs(kl) do
    local Q, _, V = qkeys(e[1])
    local m = unqueue(e[1], ticket, false)
    if m and redis.call('EXISTS', Q) == 1 then
      -- The virtual time only moves forward: a ticket granted out of turn
      -- (one of several keys, passed over before) does not set it back.
      local rank, tag = string.match(m, '^(%d+)|([^|]+)|')
      if tonumber(tag) > (tonumber(redis.call('HGET', V, 'V|' .. rank)) or 0) then
        redis.call('HSET', V, 'V|' .. rank, tag)
        redis.call('ZREMRANGEBYSCORE', e[1] .. '#f' .. rank, '-inf', tag)
      end
    end
    -- GT: a lease the ticket holds already (put back after an outage) is
    -- not shortened, nor taken for a grant. A grant is in <k>#g, scored
    -- as its lease, until it is claimed, given back or withdrawn (ungrant),
    -- or expires with its lease.
    if not redis.call('ZSCORE', e[1], ticket) then
      local G = e[1] .. '#g'
      redis.call('ZREMRANGEBYSCORE', G, '-inf', now)
      redis.call('ZADD', G, now + claim, ticket)
      cover(G, claim)
    end
    redis.call('ZADD', e[1], 'GT', now + claim, ticket)
    cover(e[1], claim)
  end
  redis.call('PUBLISH', chans .. proc, ticket)
end
-- canTake reports whether ticket, queued on k, can take a place on each
-- of its keys (kl) now.
local function canTake(T, kl, ticket, now, P, claim)
  local arrival = tonumber(redis.call('HGET', T, 'a|' .. ticket)) or 0
  for _, e in ipairs(kl) do
    if roomFor(e[1], e[2], ticket, arrival, now, P, claim) <= 0 then return false end
  end
  return true
end
-- serve grants k's waiters in order, from the one at index from (0: the
-- head), while k has room under limit: each that can take it on all of
-- its keys; a waiter of a dead process is dropped. If it stops at its
-- bound on the waiters it looks at, with room left and waiters further
-- back, who may take it, it returns one more than the index of the first
-- of those; else 0.
local function serve(k, limit, now, claim, chans, P, from)
  local Q, T = k .. '#q', k .. '#t'
  if redis.call('EXISTS', Q) == 0 then return 0 end
  local i, steps, passed = from, 0, {}
  while true do
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
    if redis.call('ZCARD', k) >= limit then return 0 end
    local head = redis.call('ZRANGE', Q, i, i)
    if #head == 0 then return 0 end
    if i >= from + scanMax or steps >= 4 * scanMax then return i + 1 end
    steps = steps + 1
    local proc, ticket = string.match(head[1], '|([^|]*)|([^|]+)$')
    local kl = ticketKeys(T, ticket, k, limit)
    if dead(P, head[1], now, claim) then
      for _, e in ipairs(kl) do unqueue(e[1], ticket, true) end
    elseif canTake(T, kl, ticket, now, P, claim) then
      grant(kl, ticket, proc, now, claim, chans)
      for _, p in ipairs(passed) do passOver(k, p) end
    else
      if #kl > 1 then passed[#passed + 1] = ticket end
      i = i + 1
    end
  end
end
-- enqueue queues ticket on each of its keys (kl), numbering its arrival
-- in the fleet's order (P's counter). A flow's start tag in a class is
-- its finish tag there (#f<rank>) or the class's virtual time, whichever
-- is later.
local function enqueue(kl, ticket, rank, flow, weight, proc, ttl, P)
  local packed
  if #kl > 1 then packed = cjson.encode(kl) end
  local arrival = redis.call('HINCRBY', P, '#arrivals', 1)
  for _, e in ipairs(kl) do
    local Q, T, V = qkeys(e[1])
    local F = e[1] .. '#f' .. rank
    local vt = tonumber(redis.call('HGET', V, 'V|' .. rank)) or 0
    local tag = math.max(vt, tonumber(redis.call('ZSCORE', F, flow)) or 0)
    local finish = tag + 1 / weight
    redis.call('ZADD', F, finish, flow)
    local seq = redis.call('HINCRBY', V, 'seq', 1)
    local m = string.format('%d|%020.6f|%012d|%s|%s', rank, tag, seq, proc, ticket)
    redis.call('ZADD', Q, 0, m)
    redis.call('HSET', T, ticket, m, 'f|' .. ticket, flow, 'a|' .. ticket, arrival, 's|' .. ticket, tag, 'e|' .. ticket, finish)
    if packed then redis.call('HSET', T, 'k|' .. ticket, packed) end
    redis.call('HINCRBY', V, 'n|' .. flow, 1)
    local cf = rank .. '|' .. flow
    if redis.call('HINCRBY', V, 'n|' .. cf, 1) == 1 then redis.call('HSET', V, 'b|' .. cf, tag) end
  end
end
-- keepQueued keeps the queues of kl from expiring under their waiters.
local function keepQueued(kl, ttl)
  for _, e in ipairs(kl) do
    local Q, T, V = qkeys(e[1])
    cover(Q, 3 * ttl) cover(T, 3 * ttl) cover(V, 3 * ttl) cover(e[1] .. '#u', 3 * ttl)
    for rank = 0, 2 do cover(e[1] .. '#f' .. rank, 3 * ttl) end
  end
end
-- alive renews proc's liveness deadline in P.
local function alive(P, proc, now, ms)
  redis.call('HSET', P, proc, now + ms)
  cover(P, 2 * ms)
end
`
