package redisstore

import "github.com/redis/go-redis/v9"

// A lease's units (see driver.Store): a key's count is the sum of the
// units of its leases, and a lease of u units has room on a key under a
// limit L while the count plus u is at most L.
//
// A lease of one unit is kept as it always was, a member of the key's
// sorted set scored by its expiry and nothing else, so that a process of
// the release before, whose scripts count a key with ZCARD, counts such
// leases right beside this one during a rolling deploy. A lease of more
// units is such a member too, and has its units in <key>#w, a hash beside
// the key: a field per weighted lease (its id: its units) and the field
// #extra, the sum over them of their units less one. So a key's count is
// its ZCARD plus #extra, and a key with no weighted lease has no hash: a
// script looks for it once per key (weighted), with the look for the
// key's queue where it takes that one anyway (hasQueue), so that leases
// of one unit cost the calls they cost before units.
//
// Every lease that leaves the sorted set takes its units off the hash:
// one that expired (expire, which drops the expired members of the set),
// and one released, abandoned, given back or found expired by a renewal
// (removeLease). The hash is deleted when #extra comes to 0, and it
// expires when its key does, at the same time (coverLeases): the key
// expires five minutes after its latest lease (silence.go), so the hash
// outlives none of its weighted leases, and a key that expired leaves no
// units behind.
//
// Scripts of an older release know nothing of the hash: a weighted lease
// counts one unit with them, and one they remove (expired) leaves its
// extra units counted until the key empties or expires. A fleet that
// weighs its leases needs every process at this release.

// unitsLua is the units' part of baseLua (after cover).
const unitsLua = `
-- weights tells, per key, whether it has weighted leases (<k>#w exists),
-- for the length of a script; the helpers below keep it up to date.
local weights = {}
local function weighted(k)
  local w = weights[k]
  if w == nil then
    w = redis.call('EXISTS', k .. '#w') == 1
    weights[k] = w
  end
  return w
end
-- hasQueue reports whether k has a queue (<k>#q), and learns on the way
-- whether it has weighted leases: one call answers both for a key with
-- neither or both, as a script's first look at a key (a key of leases of
-- one unit and no waiters pays no more than it did before units).
local function hasQueue(k)
  local n = redis.call('EXISTS', k .. '#q', k .. '#w')
  if n ~= 1 then
    weights[k] = n == 2
    return n == 2
  end
  local q = redis.call('EXISTS', k .. '#q') == 1
  weights[k] = not q
  return q
end
-- countOf returns k's count: the units of its leases, expired ones
-- included (drop them first: expire). A hash left beside an empty key
-- (only a script of an older release removes a weighted lease without its
-- units) is deleted: an empty key holds no units.
local function countOf(k)
  local n = redis.call('ZCARD', k)
  if not weighted(k) then return n end
  if n == 0 then
    redis.call('DEL', k .. '#w')
    weights[k] = false
    return 0
  end
  return n + (tonumber(redis.call('HGET', k .. '#w', '#extra')) or 0)
end
-- extraOf returns the extra units (each one's units less one) of the
-- leases ids of k. With drop, they are gone from k: their fields are
-- deleted and their units taken off #extra, and the hash goes once no
-- weighted lease is left. It reads them in parts: a call takes only so
-- many arguments.
local function extraOf(k, ids, drop)
  local W, extra = k .. '#w', 0
  for s = 1, #ids, 1000 do
    local part = {unpack(ids, s, math.min(s + 999, #ids))}
    local us = redis.call('HMGET', W, unpack(part))
    for j = 1, #part do
      local u = tonumber(us[j])
      if u then extra = extra + u - 1 end
    end
    if drop then redis.call('HDEL', W, unpack(part)) end
  end
  if drop and extra > 0 and redis.call('HINCRBY', W, '#extra', -extra) <= 0 then
    redis.call('DEL', W)
    weights[k] = false
  end
  return extra
end
-- expire drops k's expired leases (expiredBy: a grace keeps some), and
-- their units: once per key in a script, as its time stands still and
-- every lease it adds or extends expires later.
local expired = {}
local function expire(k, now)
  local by = expiredBy(now)
  if expired[k] == by then return end
  expired[k] = by
  if weighted(k) then
    local gone = redis.call('ZRANGEBYSCORE', k, '-inf', by)
    if #gone == 0 then return end
    extraOf(k, gone, true)
  end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', by)
end
-- removeLease takes lease id off k, with its units (a field left for an
-- id not in the set goes too).
local function removeLease(k, id)
  redis.call('ZREM', k, id)
  if weighted(k) then extraOf(k, {id}, true) end
end
-- weigh records that lease id, just added to k or held there, weighs u
-- units on it: a field if more than one, none if one. Setting the same
-- units again changes nothing. It returns what it adds to k's extra units
-- (see countOf). Call coverLeases after it.
local function weigh(k, id, u)
  if u <= 1 and not weighted(k) then return 0 end
  local W = k .. '#w'
  local was = tonumber(redis.call('HGET', W, id)) or 1
  if u == was then return 0 end
  if u > 1 then redis.call('HSET', W, id, u) else redis.call('HDEL', W, id) end
  if redis.call('HINCRBY', W, '#extra', u - was) <= 0 then
    redis.call('DEL', W)
    weights[k] = false
  else
    weights[k] = true
  end
  return u - was
end
-- coverLeases is cover for a key of leases, which outlives its latest
-- lease by keepLeases ms so that a grace finds the leases a silence of up
-- to that long expired (see silence.go): its hash of units expires when
-- it does, not a millisecond later or sooner (see above).
local function coverLeases(k, ttl)
  local ms = cover(k, ttl + keepLeases)
  if weighted(k) and ms > 0 then redis.call('PEXPIRE', k .. '#w', ms) end
end
`

// countScript counts a key's units held now: the units of its leases not
// expired (a grace of a silence honoured: see silence.go), without
// dropping the expired ones (a read).
//
//	KEYS: the capped key, the fleet's #heard
var countScript = redis.NewScript(baseLua + `
local k, now = KEYS[1], nowMS(redis.call('TIME'))
heard(KEYS[2], now, 0)
local by = expiredBy(now)
local n = redis.call('ZCOUNT', k, '(' .. by, '+inf')
if n == 0 or not weighted(k) then return n end
-- #extra counts the expired weighted leases too, not dropped yet.
local gone = redis.call('ZRANGEBYSCORE', k, '-inf', by)
return n + (tonumber(redis.call('HGET', k .. '#w', '#extra')) or 0) - extraOf(k, gone, false)
`)
