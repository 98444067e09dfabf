package redisstore

import (
	"strconv"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
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
// the flows of a class take turns by weight, counted in units, and a
// flow's waiters keep their order. A flow's next start tag in a class is
// its finish tag there (its last start tag plus the turn's cost per
// weight, driver.TurnCost, in the sorted set <key>#f<rank>) or the class's
// virtual time (the start tag of its last ticket granted, which only moves
// forward), whichever is later. (A process of a release before turns
// counted units moves tags by 1/weight: in a rolling deploy from one, its
// waiters' turns are counted as waiters until it is replaced; the order
// alone differs, never a count.) A flow is charged for the turns it is
// granted: if its waiters in a class all leave without a grant, its finish
// tag there goes back to the finish of its last granted turn (or the start
// of the first of them), and finish tags the virtual time has passed are
// dropped, as they no longer count. <key>#t maps each queued ticket to
// its member, its flow, its arrival in the fleet (a
// counter in the liveness hash), its units if more than one (w|: a grant
// weighs them) and, for a ticket of several keys or of more than one
// unit, all of its keys and their limits, which its calls keep up to
// date; <key>#v holds the virtual times, each flow's queued count, the
// count of its waiters of more than one unit and the sequence. All
// go when the queue empties, so tags start from 0 after every backlog. A
// grant is a lease of the claim window, listed in <key>#g (scored as its
// lease) until its waiter claims it, so that the counts of a learned
// cap's evidence leave it out.
//
// A ticket of several keys (AcquireAll) is queued on each of them, holds
// nothing while it waits, and is granted by whichever key's turn finds
// room on all of its keys. A grant that passes it over is counted, per
// key; at maxPassed it becomes one of the key's urgent tickets (<key>#u,
// by arrival). The key keeps one place (as many units as it weighs) for
// its oldest urgent ticket, which
// binds only tickets that came after it: so it is served once its other
// keys have room, and the oldest urgent ticket of the fleet is never kept
// out, which rules out a deadlock of kept places across keys. One place,
// however many are urgent: each kept place idles while its ticket waits
// for its other keys, and a place each would let a backlog on a second key
// (a model cap) take the first (the provider's) from everyone else.
//
// Every script that may free capacity on a key, or finds it free (but a
// claim where nothing expired), serves its queue first (serve): it drops
// expired leases and, while the key has room, grants the first waiter that
// can take it a lease of the claim window's length on each of its keys and
// publishes its ticket on its process's channel
// (<prefix>{<name>}#wake:<process>), so that only that process wakes. The
// waiter claims its grant by running the acquire script again, which
// extends the lease to the full TTL, unless a key is over the limit the
// waiter has now (the grant was made under a higher one): then the grant is
// given back and served, and the waiter queues again. A waiter that died or
// went slow costs the key at most the claim window; a waiter whose process
// is within 1.5 claim windows of its liveness deadline
// (<prefix>{<name>}#procs, process to deadline in server milliseconds,
// renewed by its waiters' calls, each at least once a claim window) is
// dropped, not granted, so a killed process's tickets delay no one by more
// than the liveness TTL. A newcomer never passes a waiter it has looked at
// that could take the room: it is served first.
//
// What waiters weigh (see driver.ReleaseCall): a heavy waiter is one that
// has no room for its units under the serving call's limit while they are
// at most that limit. Serving goes past a heavy waiter of one key while
// the units granted past it (u|<ticket> in the queue's hash, counted by
// charge; a waiting newcomer of one key that takes the room is counted
// too) are below its bound, and stops at it from then on, or at once at
// one of several keys, or at its bound of places once it went past one;
// then neither the waiters behind it nor a newcomer take the room until it
// is served. A waiter of several keys passes none on the key served; nor
// does a waiter of several keys as another of its keys is served, while a
// heavy waiter of more than one unit, by its own limit, stands before it on
// one of its keys (heavyBefore). A waiter that cannot take room for want of
// it on another of its keys, or under a lower limit its own calls keep for
// this key, is passed over as before (one of more than one unit kept out by
// the place an older urgent ticket keeps is heavy), and so is one whose
// units are over the limit (its process refuses it). A waiter of one unit
// is never heavy: the key it is served on has room for one.
//
// Serving looks at 64 waiters from the head; where it stops short with room
// left, a newcomer looks at 64 more, and a waiter further back takes the
// room on its own next call. A look that goes on (a newcomer's, a
// release's of several pairs on the key) knows the waiters of several keys
// that the looks before it in the same script passed: it stops where a
// grant leaves one of them heavy (passedBefore), and its grants pass them
// (passedBy, towards registry.MaxPassed), as a serving from the head
// would. The looks for heavy waiters go as far
// (heavyBefore): a heavy waiter more than 64 places past where serving
// stopped, behind waiters held up on their other keys, may be passed by a
// lighter waiter further back, on that waiter's own call or through another
// of its keys. While new admissions are paused (Redis lost its data)
// nothing is served.

// baseLua is what every script with a time shares.
const baseLua = `
local function nowMS(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A key expires with its latest lease, never sooner: a lease of a
-- process with a longer TTL (a rolling deploy that changes WithLeaseTTL)
-- may be in it.
-- It returns the key's time to live after (PTTL's answer: -2 if there is
-- no such key, which it leaves alone).
local function cover(k, ttl)
  local ms = redis.call('PTTL', k)
  if ms >= ttl or ms == -2 then return ms end
  redis.call('PEXPIRE', k, ttl)
  return ttl
end
-- ungrant takes id off k's grants not claimed yet (<k>#g): its lease on k
-- is held now, or gone. A live member always has its lease, scored alike,
-- so only where a lease may be a grant is it called (a claim, a grant
-- given back or withdrawn, a lease put back); a newcomer's or a release's
-- lease is not one, and an expired member goes with its lease's expiry
-- (admitted and grant drop the expired ones before they count).
local function ungrant(k, id) redis.call('ZREM', k .. '#g', id) end
` + silenceLua + unitsLua

// queueLua is the queue's part of the scripts (after baseLua).
var queueLua = `
local maxPassed, scanMax, passFactor = ` + strconv.Itoa(registry.MaxPassed) + `, ` + strconv.Itoa(driver.PassScan) + `, ` + strconv.Itoa(driver.PassFactor) + `
local maxTag, turnSteps = ` + strconv.FormatFloat(driver.MaxTag, 'f', -1, 64) + `, ` + strconv.Itoa(driver.TurnSteps) + `
local function qkeys(k) return k .. '#q', k .. '#t', k .. '#v' end
-- The summary of k's queue (see summary.go): x, xe, xs and xi in <k>#v;
-- summaryLen weighs a member of <k>#q in xe. marked reports whether a
-- queued ticket with the fields k| (packed) and u| (past) counts in x: it
-- is of several keys, or has been charged.
local summaryLen = 16777216
local function marked(packed, past)
  return (packed and string.find(packed, '],[', 1, true) ~= nil) or (past and true) or false
end
-- unqueue takes ticket out of k's queue, with its flow's counts and its
-- place among the urgent, and returns its member there (nil: not queued)
-- and whether k's queue is left.
-- A flow's turns in a class are charged from its first waiter queued
-- while it had none there (b|, that waiter's start tag) and as each is
-- granted (b| moves forward to the granted ticket's finish tag, e|): so
-- if its last waiter there leaves without a grant (withdrawn, dropped),
-- its finish tag goes back to b|, and the turns it never used are not
-- charged. A waiter that leaves while others of its flow wait gives its
-- turn back if it was the newest (the flow's finish tag is its own).
local function unqueue(k, ticket, leaving)
  local Q, T, V = qkeys(k)
  local f = redis.call('HMGET', T, ticket, 'w|' .. ticket, 'f|' .. ticket, 'e|' .. ticket, 's|' .. ticket, 'k|' .. ticket,
    'u|' .. ticket)
  local m = f[1]
  if not m then return nil end
  local was = redis.call('ZREM', Q, m)
  redis.call('ZREM', k .. '#u', ticket)
  redis.call('ZREM', k .. '#m', ticket)
  if f[2] and redis.call('HINCRBY', V, 'weighted', -1) <= 0 then redis.call('HDEL', V, 'weighted') end
  local flow = f[3]
  if flow then
    if redis.call('HINCRBY', V, 'n|' .. flow, -1) <= 0 then redis.call('HDEL', V, 'n|' .. flow) end
    local rank = string.match(m, '^(%d+)|')
    local cf = rank .. '|' .. flow
    local finish = tonumber(f[4])
    if finish and not leaving and finish > (tonumber(redis.call('HGET', V, 'b|' .. cf)) or 0) then
      redis.call('HSET', V, 'b|' .. cf, finish)
    end
    if finish and leaving then
      -- The flow's newest waiter there gives its turn back.
      local F = k .. '#f' .. rank
      local start = tonumber(f[5])
      -- (At maxTag it may not be the newest.)
      if start and finish < maxTag and tonumber(redis.call('ZSCORE', F, flow)) == finish then redis.call('ZADD', F, start, flow) end
    end
    if redis.call('HINCRBY', V, 'n|' .. cf, -1) <= 0 then
      local base = redis.call('HGET', V, 'b|' .. cf)
      if leaving and base then
        local F = k .. '#f' .. rank
        -- It may make F anew: F expires with the queue.
        if redis.call('ZADD', F, base, flow) == 1 then cover(F, redis.call('PTTL', Q)) end
      end
      redis.call('HDEL', V, 'n|' .. cf, 'b|' .. cf)
    end
  end
  local gone = redis.call('HDEL', T, ticket, 'f|' .. ticket, 'k|' .. ticket, 'p|' .. ticket, 'a|' .. ticket, 'e|' .. ticket,
    's|' .. ticket, 'w|' .. ticket, 'u|' .. ticket)
  if redis.call('EXISTS', Q) == 0 then
    redis.call('DEL', T, V, k .. '#u', k .. '#m', k .. '#f0', k .. '#f1', k .. '#f2')
    return m, false
  end
  -- The summary follows (see summary.go): a ticket counts in x while queued.
  redis.call('HINCRBY', V, 'xe', -gone - summaryLen * was)
  if was == 1 and marked(f[6], f[7]) then redis.call('HINCRBY', V, 'x', -1) end
  return m, true
end
-- ticketKeys returns the {key, limit} pairs of a ticket queued on k,
-- whose limit there is at most limit (a ticket of one key: limit, though
-- a weighted one keeps its own), its units, and the units granted past it
-- (see serve).
-- (keysOf reads them from the fields k|, w|, u| its caller has.)
local function keysOf(packed, w, u, k, limit)
  local units, past = tonumber(w) or 1, tonumber(u) or 0
  if not packed then return {{k, limit}}, units, past end
  local kl = cjson.decode(packed)
  if #kl == 1 then kl[1][2] = limit end
  for _, e in ipairs(kl) do
    if e[1] == k then e[2] = math.min(e[2], limit) end
  end
  return kl, units, past
end
local function ticketKeys(T, ticket, k, limit)
  local f = redis.call('HMGET', T, 'k|' .. ticket, 'w|' .. ticket, 'u|' .. ticket)
  return keysOf(f[1], f[2], f[3], k, limit)
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
` + urgentLua + `
-- grant gives ticket a lease of the claim window, weighing its units, on
-- each of its keys (kl), takes it out of their queues, moving each class's
-- virtual time to its start tag there (and forgetting the finish tags of
-- flows it has passed: their next start is the virtual time anyway), and
-- wakes its process. It returns the units it adds to the count of the key
-- served. The keys it grants on, and their grants where it adds one, are
-- covered as serving ends (coverGrants): once, however many grants it
-- makes.
local grantedOn, grantedList, grantsAdded = {}, {}, {}
local function grant(kl, ticket, units, proc, now, claim, chans, served)
  local added = 0
  for _, e in ipairs(kl) do
    local V = e[1] .. '#v'
    local m, left = unqueue(e[1], ticket, false)
    if m and left then
      -- The virtual time only moves forward: a ticket granted out of turn
      -- (one of several keys, passed over before) does not set it back.
      local rank, tag = string.match(m, '^(%d+)|([^|]+)|')
      if tonumber(tag) > (tonumber(redis.call('HGET', V, 'V|' .. rank)) or 0) then
        redis.call('HSET', V, 'V|' .. rank, tag)
        redis.call('ZREMRANGEBYSCORE', e[1] .. '#f' .. rank, '-inf', tag)
      end
    end
    -- GT: a lease the ticket holds already (put back after an outage,
    -- with its units) is not shortened, nor taken for a grant. A grant is
    -- in <k>#g, scored as its lease, until it is claimed, given back or
    -- withdrawn (ungrant), or expires with its lease.
    local new = not redis.call('ZSCORE', e[1], ticket)
    if new then
      local G = e[1] .. '#g'
      redis.call('ZREMRANGEBYSCORE', G, '-inf', expiredBy(now))
      redis.call('ZADD', G, now + claim, ticket)
      grantsAdded[e[1]] = true
    end
    redis.call('ZADD', e[1], 'GT', now + claim, ticket)
    if new then
      local d = 1 + weigh(e[1], ticket, units)
      if e[1] == served then added = d end
    end
    if not grantedOn[e[1]] then
      grantedOn[e[1]] = true
      grantedList[#grantedList + 1] = e[1]
    end
  end
  redis.call('PUBLISH', chans .. proc, ticket)
  return added
end
-- coverGrants covers the keys grants were made on, and their grants.
local function coverGrants(claim)
  for _, k in ipairs(grantedList) do
    if grantsAdded[k] then cover(k .. '#g', claim) end
    coverLeases(k, claim)
    grantedOn[k], grantsAdded[k] = nil, nil
  end
  grantedList = {}
end
-- weightedWaiters tells, per key, whether its queue may hold waiters of
-- more than one unit (its #v counts them), for the length of a script.
local weightedWaiters = {}
-- heavyBefore reports whether a heavy waiter of more than one unit (see
-- serve) stands before ticket in k's queue, among the scanMax waiters
-- from index from on: one of a live process without room on k for its
-- units while they are at most the limit, limit if given, else its own
-- limit there (see driver.ReleaseCall). A queue without weighted waiters
-- has none, and costs one look.
local function heavyBefore(k, ticket, from, limit, now, P, claim)
  local Q, T, V = qkeys(k)
  if weightedWaiters[k] == nil then weightedWaiters[k] = redis.call('HEXISTS', V, 'weighted') == 1 end
  if not weightedWaiters[k] then return false end
  local m = redis.call('HGET', T, ticket)
  local at = m and redis.call('ZRANK', Q, m)
  if not at or at <= from then return false end
  expire(k, now)
  local count = countOf(k)
  for _, w in ipairs(redis.call('ZRANGE', Q, from, math.min(at, from + scanMax) - 1)) do
    local id = string.match(w, '|([^|]+)$')
    local f = redis.call('HMGET', T, 'w|' .. id, 'k|' .. id)
    local units, lim = tonumber(f[1]) or 1, limit
    if units > 1 and not lim and f[2] then
      for _, e in ipairs(cjson.decode(f[2])) do
        if e[1] == k then lim = e[2] end
      end
    end
    if units > 1 and lim and units <= lim and count + units > lim and not dead(P, w, now, claim) then return true end
  end
  return false
end
-- canTake reports whether ticket, queued on k, can take room for its
-- units on each of its keys (kl) now; as k's queue is served (served,
-- whose count is count, and the ticket's arrival is known), not while a
-- heavy waiter stands before it on another of its keys.
local function canTake(T, kl, ticket, units, now, P, claim, served, arrival, count)
  arrival = arrival or tonumber(redis.call('HGET', T, 'a|' .. ticket)) or 0
  for _, e in ipairs(kl) do
    local known
    if e[1] == served then known = count end
    if roomFor(e[1], e[2], ticket, arrival, now, P, claim, known) < units then return false end
  end
  if served and #kl > 1 then
    for _, e in ipairs(kl) do
      if e[1] ~= served and heavyBefore(e[1], ticket, 0, nil, now, P, claim) then return false end
    end
  end
  return true
end
` + summaryLua + lookBoundLua + `
-- serveFrom grants k's waiters in order, from the one at index from (0: the
-- head), while k has room under limit: each that can take room for its
-- units on all of its keys; a waiter of a dead process is dropped. If it
-- stops at its bound on the waiters it looks at, with room left and
-- waiters further back, who may take it, it returns one more than the
-- index of the first of those; if it stops at a heavy waiter (no room
-- under limit for its units, which are at most limit), whose room nobody
-- else may take, -1, and so it does at its bound once it went past one;
-- else 0, and the heavy waiter of one key it went past (up to its bound,
-- see driver.ReleaseCall), if any: a waiter of several keys passes none.
-- From from > 0 it knows the waiters of several keys that the servings of
-- k before it in the script passed (passedBefore, passedBy): it stops
-- where one is heavy, as past one of its own, and its grants pass them.
local function serveFrom(k, limit, now, claim, chans, P, from)
  local Q, T = k .. '#q', k .. '#t'
  if redis.call('EXISTS', Q) == 0 then return 0 end
  local resumed = from > 0
  -- Going on, it goes on from the first waiter the serving before it did
  -- not look at (lookedTo): waiters before it may have left since (granted
  -- through another of their keys), and an index would skip as many
  -- waiters it never looked at. Members sort by their bytes (all score 0).
  -- With no mark, a serving of k from the head since (a grant given back)
  -- ended short of its bound: k full, its queue looked at to the end, or
  -- none of it fitting. The script only adds leases, so this look grants
  -- nothing (and passes nobody twice); it may meet a heavy waiter.
  if not resumed then
    lookedTo[k] = nil
  elseif lookedTo[k] then
    from = redis.call('ZLEXCOUNT', Q, '-', '(' .. lookedTo[k])
  end
  local i, steps, blocker = from, 0, nil
  -- Those passed before from (the first carried of passed, which goes on
  -- as passedBefore does) are passed by its grants too. Whether one is
  -- still queued (not granted through another of its keys since) is
  -- looked at as a grant passes it, not at each serving (as many looks
  -- per serving as waiters before it); one gone, or urgent (passing it
  -- again changes nothing), is forgotten.
  local passed = resumed and passedBy[k] or {}
  local carried = #passed
  passedBy[k] = passed
  -- The units of the waiters of several keys passed, of live processes,
  -- from the head on: those before from too (passedBefore).
  local passedUnits = resumed and passedBefore[k] or {}
  passedBefore[k] = passedUnits
  expire(k, now) -- once: no lease expires while a script runs
  local count = countOf(k) -- and what each grant adds
  if not resumed and count < limit then
    local r, b = noneFits(k, Q, T, limit, count, now, P, claim)
    if r then return r, b end
  end
  -- Going on past the look bound: a waiter of several keys before from
  -- that is heavy now keeps the room, as a serving from the head would
  -- stop at it.
  if resumed and count < limit and heavyPassed(T, passedUnits, limit, count) then return -1 end
  -- The members from i on, read scanMax at a time, with their keys,
  -- units, units passed and arrival (meta, four fields each) and their
  -- processes' liveness deadlines (live). A grant keeps it: it takes its
  -- own ticket out of k's queue, and tickets canTake drops are dead, met
  -- as such.
  local win, w, meta, live = {}, 1, {}, {}
  while true do
    if count >= limit then return 0 end
    if w > #win then
      win, w = redis.call('ZRANGE', Q, i, i + scanMax - 1), 1
      local fields, procs = {}, {}
      for j, m in ipairs(win) do
        local proc, id = string.match(m, '|([^|]*)|([^|]+)$')
        fields[4 * j - 3], fields[4 * j - 2], fields[4 * j - 1], fields[4 * j] = 'k|' .. id, 'w|' .. id, 'u|' .. id, 'a|' .. id
        procs[j] = proc
      end
      if #fields > 0 then
        meta, live = redis.call('HMGET', T, unpack(fields)), redis.call('HMGET', P, unpack(procs))
      end
    end
    local m = win[w]
    if not m then return 0, blocker end
    if i >= from + scanMax or steps >= 4 * scanMax then
      if blocker then return -1 end
      lookedTo[k] = m
      return i + 1
    end
    steps = steps + 1
    local units, past = tonumber(meta[4 * w - 2]) or 1, tonumber(meta[4 * w - 1]) or 0
    local arrival, living = tonumber(meta[4 * w]) or 0, (tonumber(live[w]) or 0) > now + 1.5 * claim
    if blocker and units > 1 and units <= limit and count + units > limit and past < passFactor * units
        and not (meta[4 * w - 3] and string.find(meta[4 * w - 3], '],[', 1, true)) and living then
      -- Past the first heavy waiter, one of one key under its bound, of a
      -- live process (see dead), keeps nothing: serving looks on, at no
      -- cost.
      i, w = i + 1, w + 1
    else
      local proc, ticket = string.match(m, '|([^|]*)|([^|]+)$')
      local kl, units, past = keysOf(meta[4 * w - 3], meta[4 * w - 2], meta[4 * w - 1], k, limit)
      -- A heavy waiter: k's room waits for its units, counted (looked at
      -- first: it is cheap) or with the place an older urgent ticket keeps
      -- set aside. One of one key is passed up to its bound.
      local heavy = units > 1 and units <= limit and count + units > limit
      local keeps = heavy and (#kl > 1 or past >= passFactor * units)
      if not living and dead(P, m, now, claim) then
        for _, e in ipairs(kl) do unqueue(e[1], ticket, true) end
        win = {}
      elseif keeps then
        return -1
      elseif not heavy and (not blocker or #kl == 1) and canTake(T, kl, ticket, units, now, P, claim, k, arrival, count) then
        local bound = false
        if blocker then -- before the grant takes its flow away
          bound = charge(T, blocker, redis.call('HGET', T, 'f|' .. ticket) or '', string.match(m, '^(%d+)|'), units)
        end
        count, w = count + grant(kl, ticket, units, proc, now, claim, chans, k), w + 1
        local n, kept = 0, 0
        for j, p in ipairs(passed) do
          -- Passed by this serving, it is queued; carried, it may have left.
          if (j > carried or redis.call('HEXISTS', T, p) == 1) and passOver(k, p) < maxPassed then
            n = n + 1
            passed[n] = p
            if j <= carried then kept = kept + 1 end
          end
        end
        for j = #passed, n + 1, -1 do passed[j] = nil end
        carried = kept
        -- The heavy waiter it went past has been passed its bound, or a
        -- waiter of several keys it passed is heavy now: serving stops
        -- there, as it would meeting it now.
        if bound and count < limit then return -1 end
        if count < limit and heavyPassed(T, passedUnits, limit, count) then return -1 end
      elseif heavy or units > 1 and units <= limit and roomFor(k, limit, ticket, arrival, now, P, claim, count) < units then
        if #kl > 1 or past >= passFactor * units then return -1 end
        blocker = blocker or ticket
        i, w = i + 1, w + 1
      else
        if #kl > 1 then
          passed[#passed + 1] = ticket
          if living and units > 1 then passedUnits[ticket] = units end -- one unit is never heavy
        end
        i, w = i + 1, w + 1
      end
    end
  end
end
-- serve is serveFrom, with the keys it granted on covered once, at its end.
local function serve(k, limit, now, claim, chans, P, from)
  local r, b = serveFrom(k, limit, now, claim, chans, P, from)
  coverGrants(claim)
  return r, b
end
`
