package redisstore

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the Redis server and take every time from
// its clock (TIME), never from a client's: the processes of a fleet need
// not agree on the time.
//
// Each capped key is a sorted set: member = lease id, score = the lease's
// expiry in server milliseconds; a lease of more than one unit has its
// units in a hash beside it (see units.go). A lease has expired once the
// server's time passes its expiry, but in the grace after a silence (see
// silence.go). A key's own expiry is five minutes after its latest
// lease's: a lease added or extended sets it only if it would come later
// (processes with different TTLs share keys). Keys whose holders all died
// go away by themselves.

// The fixed keys and arguments of an acquire call, before its capped keys
// and their limits.
const (
	acquireKeys = 4
	acquireArgs = 17
)

// acquireScript takes one lease on every key or on none, or queues for
// them (see queue.go).
//
//	KEYS: the epoch key, the pause key, the lease id's tombstone, the
//	      name's #procs, the n capped keys, then for each carried (key,
//	      lease) pair the key and the lease id's tombstone, then the
//	      name's #heard (silence.go)
//	ARGV: 1 lease id, 2 ttl ms, 3 n, 4 the call's not-after time (0:
//	      none), 5 the epoch the caller last saw (0: none), 6 the pause ms
//	      it declares, 7 wait (1: queue if full) + 2 if a key is learned
//	      (the reply tells the start's number and counts), 8 claim ms, 9 class rank,
//	      10 flow, 11 flow weight, 12 process, 13 the channel prefix, 14
//	      the queue's bound, 15 the flow's bound (-1: none), 16 liveness
//	      ms, 17 the lease's units (1 or more), then each capped key's
//	      limit, then the lease id and units of each carried pair
//
// Past its not-after time (see clock.go) it refuses to run, and changes
// nothing. Otherwise it first puts in the carried pairs, with their units,
// without a cap check, unless their tombstone exists: leases this process
// admitted while Redis was unreachable and that share a key with this
// admission, so that they count against it. A lease id whose tombstone
// exists was abandoned (see abandonScript) and is refused. A waiter's
// lease on every key (a granted ticket claimed, or a retried call), each
// key's count within its limit, is extended to the TTL and admitted. Else,
// unless new admissions are paused, it serves each key's queue. Then: if
// the lease is on every key, it is extended and admitted unless a count
// is over its limit (a grant made under a limit lowered since is given
// back; a part of a grant whose claim ran out is dropped); while new
// admissions are paused, nothing is admitted; a
// ticket still queued is told so; a newcomer is admitted if every key has
// room for its units and serving stopped at no heavy waiter (see
// queue.go), else refused, or, with wait, queued on every key unless a
// bound says no. It returns {status (1 admitted; 0 a key is full;
// acquirePaused; acquireQueued; acquireQueueMax; acquireFlowMax; -1
// abandoned; tooLate), index of the key that refused (1-based; 0 if
// none), its count in units (the first key's if paused or queued), its
// earliest lease expiry (the pause's end if paused; 0 if none), now,
// epoch (0 if too late), the length of its queue in tickets (its flow's
// part for acquireFlowMax)}, times in server milliseconds; with a learned
// key, an admission's reply has the server time in microseconds in place
// of the expiry, and goes on with each key's units held after it.
var acquireScript = redis.NewScript(acquireLua)

var acquireLua = baseLua + epochLua + queueLua + queueAdmitLua + `
-- admitted is the reply to an admission; for a learned key's, with the
-- server time in microseconds (the start's number) and each key's units
-- held with it, after the fixed fields: the leases held, not the grants
-- not claimed yet (<k>#g), whose requests are not at the upstream.
local function admitted(kl, t, now, epoch)
  if tonumber(ARGV[7]) < 2 then return {1, 0, 0, 0, now, epoch, 0} end
  local out = {1, 0, 0, tonumber(t[1]) * 1000000 + tonumber(t[2]), now, epoch, 0}
  for i, e in ipairs(kl) do
    local G = e[1] .. '#g'
    redis.call('ZREMRANGEBYSCORE', G, '-inf', expiredBy(now))
    local grants = redis.call('ZCARD', G)
    if grants > 0 and weighted(e[1]) then grants = grants + extraOf(e[1], redis.call('ZRANGE', G, 0, -1), false) end
    out[7 + i] = countOf(e[1]) - grants
  end
  return out
end
local H = table.remove(KEYS)
local t = redis.call('TIME')
local now = nowMS(t)
local notAfter = tonumber(ARGV[4])
if notAfter > 0 and now > notAfter then return {-2, 0, 0, 0, now, 0, 0} end
local id, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
heard(H, now, ttl)
local claim, P, chans = tonumber(ARGV[8]), KEYS[4], ARGV[13]
local units = math.max(tonumber(ARGV[17]), 1)
local epoch, paused = epochOf(t, now, KEYS[1], KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]), ttl, H)
for j = 1, (#KEYS - 4 - n) / 2 do
  local k, tomb = KEYS[3 + n + 2 * j], KEYS[4 + n + 2 * j]
  local lease = ARGV[16 + n + 2 * j]
  if redis.call('EXISTS', tomb) == 0 then
    -- A units hash left beside an emptied key goes before the lease comes.
    expire(k, now)
    countOf(k)
    redis.call('ZADD', k, now + ttl, lease)
    weigh(k, lease, math.max(tonumber(ARGV[17 + n + 2 * j]), 1))
    ungrant(k, lease)
    coverLeases(k, ttl)
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1, 0, 0, 0, now, epoch, 0} end
local kl = {}
for i = 1, n do kl[i] = {KEYS[4 + i], tonumber(ARGV[17 + i])} end
-- extend makes the lease held on every key the caller's for the TTL.
local function extend()
  for _, e in ipairs(kl) do
    redis.call('ZADD', e[1], 'XX', now + ttl, id)
    -- A grant weighs its ticket's units already; a call made again sets
    -- the same.
    if units > 1 then weigh(e[1], id, units) end
    ungrant(e[1], id)
    coverLeases(e[1], ttl)
  end
  return admitted(kl, t, now, epoch)
end
-- A waiter's claim (or a call made again) whose lease is on every key,
-- where no lease has expired and the count is within the caller's limit,
-- is extended without serving the queues first: it frees nothing, every
-- call that freed room served it, and room a raised limit makes is served
-- by the waiters' asks. It takes a third off a claim's time on the
-- server. Anything else, and a call that does not wait (no claim), takes
-- the whole path.
local mine = tonumber(ARGV[7]) % 2 == 1
for _, e in ipairs(kl) do
  if not mine then break end
  local first = redis.call('ZRANGE', e[1], 0, 0, 'WITHSCORES')
  mine = tonumber(redis.call('ZSCORE', e[1], id)) ~= nil and tonumber(first[2]) > expiredBy(now) and countOf(e[1]) <= e[2]
end
if mine then return extend() end
local stopped = paused > now and capped(18, n)
if (n > 1 or units > 1) and redis.call('HEXISTS', KEYS[5] .. '#t', id) == 1 then
  -- Queued: its keys' limits as the caller has them now, before serving
  -- (and, with a key paused or no longer, whether it is urgent: urge).
  local packed = cjson.encode(kl)
  for _, e in ipairs(kl) do
    local T, V = e[1] .. '#t', e[1] .. '#v'
    local f = redis.call('HMGET', T, id, 'k|' .. id, 'u|' .. id)
    if f[1] then
      -- The queue's summary follows (see clearBehind in summary.go).
      if redis.call('HSET', T, 'k|' .. id, packed) == 1 then redis.call('HINCRBY', V, 'xe', 1) end
      local was, is = marked(f[2], f[3]), marked(packed, f[3])
      if was ~= is then redis.call('HINCRBY', V, 'x', is and 1 or -1) end
      if n > 1 then urge(e[1], id, kl) end
    end
  end
end
local held, stop = 0, 0
for i, e in ipairs(kl) do
  -- e[3]: k has a queue (or had one before serving it); e[4]: where
  -- serving it stopped short, or -1 if at a heavy waiter; e[5]: the heavy
  -- waiter it went past (see serve)
  e[3] = hasQueue(e[1])
  e[4] = 0
  if e[3] and not stopped then e[4], e[5] = serve(e[1], e[2], now, claim, chans, P, 0) end
  if e[4] > 0 and stop == 0 then stop = i end
end
-- Counted once every key is served: serving a later key may grant the
-- ticket on all of its keys, those served before too.
for _, e in ipairs(kl) do
  expire(e[1], now)
  if redis.call('ZSCORE', e[1], id) then held = held + 1 end
end
-- givenBack: a grant made under a limit that has dropped since (another
-- process's, or its own before a change) is given back, and its places
-- served; its waiter queues again, past the bounds it was within.
local givenBack = false
if held == n then
  for _, e in ipairs(kl) do
    if countOf(e[1]) > e[2] then givenBack = true end
  end
  if not givenBack then return extend() end
end
if held > 0 then
  -- Off every key before any is served: a waiter of several of them
  -- needs the room on each.
  for _, e in ipairs(kl) do
    removeLease(e[1], id)
    ungrant(e[1], id)
  end
  for _, e in ipairs(kl) do
    if e[3] and not stopped then
      -- Serving again may stop at a heavy waiter the room given back is
      -- not enough for, or get past one it stopped at.
      local r, b = serve(e[1], e[2], now, claim, chans, P, 0)
      if r < 0 or e[4] < 0 then e[4] = r end
      e[5] = e[5] or b
    end
  end
end
local proc, live = ARGV[12], tonumber(ARGV[16])
local T1 = KEYS[5] .. '#t'
local queued = kl[1][3] and redis.call('HEXISTS', T1, id) == 1
if queued then -- also while paused: its place outlasts the pause
  alive(P, proc, now, live)
  keepQueued(kl, ttl, now, false)
end
if stopped then
  return {2, 0, countOf(KEYS[5]), paused, now, epoch, 0}
end
if queued then
  -- Serving stopped short of it: it takes the room if it can, unless a
  -- heavy waiter may be ahead of it: serving stopped at one, one waits
  -- between where serving stopped and this ticket, or one stands before
  -- it by its own limit.
  local clear = stop > 0
  for _, e in ipairs(kl) do
    if e[4] < 0 or (clear and e[4] > 0 and heavyBefore(e[1], id, e[4] - 1, e[2], now, P, claim))
      or (clear and heavyBefore(e[1], id, 0, nil, now, P, claim)) then clear = false end
  end
  if clear and canTake(T1, kl, id, units, now, P, claim) then
    for _, e in ipairs(kl) do
      unqueue(e[1], id, false)
      redis.call('ZADD', e[1], now + ttl, id)
      weigh(e[1], id, units)
      coverLeases(e[1], ttl)
    end
    return admitted(kl, t, now, epoch)
  end
  -- It names the first of its keys without room for it, or kept for a
  -- heavy waiter (the first if none).
  local w = 1
  for i, e in ipairs(kl) do
    if e[4] < 0 or countOf(e[1]) + units > e[2] then w = i break end
  end
  local k = kl[w][1]
  return {3, w, countOf(k), earliestOf(k), now, epoch, redis.call('ZCARD', k .. '#q')}
end
-- A newcomer: a key whose serving stopped at a heavy waiter is full for
-- it, and so is one whose serving went past one, unless the newcomer is
-- of that key alone and waits (it passes it as a waiter would, counted
-- below); where serving stopped short, it looks further; it takes the
-- room only if no waiter that it has looked at can.
local full = 0
for i, e in ipairs(kl) do
  if e[4] > 0 then
    local r
    r, e[5] = serve(e[1], e[2], now, claim, chans, P, e[4] - 1)
    if r ~= 0 then full = i break end
  end
  if e[4] < 0 or (e[5] and (n > 1 or tonumber(ARGV[7]) % 2 == 0)) then full = i break end
end
-- The first key without room names the refusal, if it comes before one
-- kept for a heavy waiter.
local last = #kl
if full > 0 then last = full - 1 end
for i = 1, last do
  local e, room = kl[i], nil
  if e[3] then room = roomFor(e[1], e[2], nil, nil, now, P, claim) else room = e[2] - countOf(e[1]) end
  if room < units then full = i break end
end
if full == 0 then
  for _, e in ipairs(kl) do
    redis.call('ZADD', e[1], now + ttl, id)
    weigh(e[1], id, units)
    coverLeases(e[1], ttl)
  end
  if kl[1][5] then charge(kl[1][1] .. '#t', kl[1][5], ARGV[10], ARGV[9], units) end
  return admitted(kl, t, now, epoch)
end
local k = kl[full][1]
local count, earliest = countOf(k), earliestOf(k)
local queued = redis.call('ZCARD', k .. '#q')
if tonumber(ARGV[7]) % 2 == 0 then return {0, full, count, earliest, now, epoch, queued} end
local maxQ, maxF, flow = tonumber(ARGV[14]), tonumber(ARGV[15]), ARGV[10]
for i, e in ipairs(kl) do
  if givenBack then break end
  local q = redis.call('ZCARD', e[1] .. '#q')
  if maxQ >= 0 and q >= maxQ then return {4, i, countOf(e[1]), earliestOf(e[1]), now, epoch, q} end
  local f = tonumber(redis.call('HGET', e[1] .. '#v', 'n|' .. flow)) or 0
  if maxF >= 0 and f >= maxF then return {5, i, countOf(e[1]), earliestOf(e[1]), now, epoch, f} end
end
enqueue(kl, id, units, tonumber(ARGV[9]), flow, tonumber(ARGV[11]), proc, ttl, P)
keepQueued(kl, ttl, now, true)
alive(P, proc, now, live)
return {3, full, count, earliest, now, epoch, queued + 1}
`

// What the acquire script returns first.
const (
	acquireFull     = 0 // a key is full, and the caller does not wait
	acquireAdmitted = 1
	// acquirePaused: new admissions are paused after Redis lost its data,
	// until the time it returns fourth.
	acquirePaused = 2
	// tooLate: it refused to run past its not-after time. The renew script
	// returns it too.
	tooLate = -2

	acquireQueued   = 3 // the lease id waits in the queue (see queue.go)
	acquireQueueMax = 4 // the queue is at its bound (slots.WithMaxQueue)
	acquireFlowMax  = 5 // the caller's flow is at its bound in the queue
)

// What renewScript does with a lease it finds missing (a mode), and what
// became of each lease (a status).
const (
	renewOnly = iota // report it
	reassert         // put it back: without a check if the epoch changed, else if there is room
	putBack          // put it back without a check (admitted while Redis was unreachable)

	leaseRenewed = 0 // it was there, and was extended
	leasePutBack = 1 // missing, put back without a check
	leaseRoom    = 2 // missing under the same epoch (expired), put back: there was room
	leaseGone    = 3 // missing, and not put back
)

// renewScript extends leases that still exist, in one call for many.
//
//	KEYS: the epoch key, the pause key, then for each lease its capped keys
//	      and its tombstone, then the name's #heard
//	ARGV: ttl ms, the call's not-after time (0: none), the epoch the caller
//	      last saw (0: none), the pause ms it declares, then for each
//	      lease: its id, its mode, the epoch under which it was last known
//	      to be in Redis (0: not known to be), its number of keys n, its
//	      units (1 or more), and each key's limit
//
// Past its not-after time (see clock.go) it refuses to run, changes
// nothing and returns {tooLate, now}. Otherwise:
//
// A lease that is gone from a key (released, expired, or lost with Redis's
// data) is never extended there. With the mode putBack it is put back
// without a cap check, and with reassert too if the epoch is not the one it
// was last seen under (Redis lost it); with reassert under the same epoch
// (it expired), or if it was not known to be in Redis (it was lost before),
// it is put back only if every key it is missing from has room for its
// units by its limit, and new admissions are not paused (it would be
// one; a failover's pause excepted, see epoch.go), else on none. A lease put back weighs its units there. Nothing is
// put back whose tombstone exists (a late renewal must not bring back a
// lease released meanwhile). It returns the epoch, now (server
// milliseconds), then each lease's status.
var renewScript = redis.NewScript(baseLua + epochLua + `
local H = table.remove(KEYS)
local t = redis.call('TIME')
local now = nowMS(t)
local notAfter = tonumber(ARGV[2])
if notAfter > 0 and now > notAfter then return {-2, now} end
local ttl = tonumber(ARGV[1])
heard(H, now, ttl)
local epoch, paused, failover = epochOf(t, now, KEYS[1], KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ttl, H)
local out = {epoch, now}
local a, k = 5, 3
while a <= #ARGV do
  local id, mode, known, n = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local units = math.max(tonumber(ARGV[a + 4]), 1)
  local missing = {}
  for i = 0, n - 1 do
    local key = KEYS[k + i]
    local score = redis.call('ZSCORE', key, id)
    if score and tonumber(score) > expiredBy(now) then
      redis.call('ZADD', key, 'XX', now + ttl, id)
      coverLeases(key, ttl)
    else
      -- Expired, not dropped yet: it goes with its units.
      if score then removeLease(key, id) end
      missing[#missing + 1] = i
    end
  end
  local status = 0
  if #missing > 0 then
    status = 3
    if mode > 0 and redis.call('EXISTS', KEYS[k + n]) == 0 then
      local checked = mode == 1 and (known == 0 or known == epoch)
      local room = not (checked and paused > now and not failover and capped(a + 5, n))
      if checked and room then
        for _, i in ipairs(missing) do
          local key = KEYS[k + i]
          expire(key, now)
          if countOf(key) + units > tonumber(ARGV[a + 5 + i]) then room = false end
        end
      end
      if room then
        for _, i in ipairs(missing) do
          local key = KEYS[k + i]
          expire(key, now)
          countOf(key) -- as for a carried pair: no stale units hash
          redis.call('ZADD', key, now + ttl, id)
          weigh(key, id, units)
          ungrant(key, id)
          coverLeases(key, ttl)
        end
        status = 1
        if checked then status = 2 end
      end
    end
  end
  out[#out + 1] = status
  a = a + 5 + n
  k = k + n + 1
end
return out
`)

// releaseScript removes leases, then serves the queue of each key
// (unless new admissions are paused, or it finds a failover: see
// epoch.go), in the order the keys first come,
// under the lowest limit its pairs name: a batch of many leases on one key
// serves its queue with all the room they freed, not once per lease. Where
// serving stops at its bound with room left, it goes on from there, up to
// once for each pair on the key, as serving once per lease did.
//
//	KEYS: the pause key, the name's #procs, then the capped keys, one per
//	      (key, lease) pair, then the name's #heard
//	ARGV: claim ms, the channel prefix, then the lease id and the key's
//	      limit of each pair, then the caller's ttl ms (0: none) and the
//	      pause ms it declares after a failover
var releaseScript = redis.NewScript(baseLua + failoverLua + queueLua + `
local H = table.remove(KEYS)
local now = nowMS(redis.call('TIME'))
local pause = tonumber(table.remove(ARGV))
local ttl = tonumber(table.remove(ARGV))
heard(H, now, ttl)
local serving = servesAfterFailover(H, now, KEYS[1], pause, ttl)
local claim, chans = tonumber(ARGV[1]), ARGV[2]
local order, limits, npairs = {}, {}, {}
for i = 3, #KEYS do
  local k, limit = KEYS[i], tonumber(ARGV[2 * i - 2])
  if hasQueue(k) and serving then
    if not limits[k] then order[#order + 1] = k end
    limits[k], npairs[k] = math.min(limits[k] or limit, limit), (npairs[k] or 0) + 1
  end
  removeLease(k, ARGV[2 * i - 3])
end
for _, k in ipairs(order) do
  local r, n = serve(k, limits[k], now, claim, chans, KEYS[2], 0), 1
  while r > 0 and n < npairs[k] do
    r, n = serve(k, limits[k], now, claim, chans, KEYS[2], r - 1), n + 1
  end
end
return 0
`)

// abandonScript takes back what an acquire call that failed on the client's
// side (a timeout, a cancelled context), or a waiter that gave up, may
// still do on the server: it takes the lease id out of the keys' queues
// and leases, and leaves a tombstone, so that the call, if it runs later,
// adds nothing.
//
// The tombstone stays for the TTL, and at least until the latest not-after
// time of the calls that may add the lease. With the keys' limits it then
// serves their queues, as a release does (unless new admissions are
// paused, or a failover is found: see epoch.go).
//
//	KEYS: the pause key, the name's #procs, the capped keys, then the lease
//	      id's tombstone and the name's #heard
//	ARGV: lease id, ttl ms, the calls' latest not-after time (0: none),
//	      claim ms, the channel prefix, the pause ms it declares after a
//	      failover, then each key's limit (none: no serving)
var abandonScript = redis.NewScript(baseLua + failoverLua + queueLua + `
local H = table.remove(KEYS)
local tomb = table.remove(KEYS)
local id = ARGV[1]
local now = nowMS(redis.call('TIME'))
heard(H, now, tonumber(ARGV[2]))
local serving = servesAfterFailover(H, now, KEYS[1], tonumber(ARGV[6]), tonumber(ARGV[2]))
for i = 3, #KEYS do
  local k = KEYS[i]
  unqueue(k, id, true)
  removeLease(k, id)
  ungrant(k, id)
end
-- Served once the lease is gone from every key: a waiter of several of
-- them needs its room on each.
for i = 3, #KEYS do
  local limit = tonumber(ARGV[4 + i])
  if serving and limit then serve(KEYS[i], limit, now, tonumber(ARGV[4]), ARGV[5], KEYS[2], 0) end
end
local stay = tonumber(ARGV[2])
local latest = tonumber(ARGV[3])
if latest > 0 then stay = math.max(stay, latest - now + 1) end
redis.call('SET', tomb, '1', 'PX', string.format('%.0f', stay))
return 0
`)
