package redisstore

// The silence (see driver.Store): a lease's TTL runs only while Redis is
// heard. <prefix>{<name>}#heard is a hash with no expiry: h, the server
// time (ms) of the last script with a TTL, written when it is TTL/16 old or
// more (so that most calls only read it); and, after a silence, c, the
// time it began (the h it found), and u, the end of its grace. (r, k and
// f tell of failovers: see epoch.go.)
//
// A script with a TTL that finds h more than TTL/2 before now (every live
// process calls each TTL/3, holding leases or not: a hang of Redis, or
// every process stopped or cut off) holds until now + TTL every lease that
// had not expired at h: until u, a lease expires only if its expiry is at
// c or before, wherever the scripts drop expired leases or find a lease
// expired. Redis keeps no list of a fleet's keys, so this is how a lease
// is held without being rewritten: the holders renew once they reach
// Redis, and no newcomer takes their room meanwhile.
//
// For the leases to be there to hold, a key of leases lives five minutes
// (keepLeases) past its latest lease's expiry: a silence longer than that
// may find a key gone, and its holders put their leases back only if
// there is room, as after an expiry. A silence that began inside a grace
// (h before u: Redis hung again before the holders could renew) keeps the
// grace's c, but no grace counts more than keepLeases after its c,
// however many silences follow one another. A lease added in a grace that
// its holder does not renew is held until u too: a grace holds every
// lease until its end. A clock stepped back (now before h) finds no
// silence.
//
// Scripts of the release before neither write h nor honour a grace: while
// only they call, h grows old, and the next script of this release may
// find a silence that was none and hold leases up to a TTL longer.

// silenceLua is the silence's part of baseLua, before the units' part.
const silenceLua = `
local keepLeases = 300000
-- cut: leases whose expiry is at it or before have expired (see
-- silence.go); graceEnd: the end of a grace (0: none), when every lease
-- held past its expiry by it has expired.
local cut, graceEnd = nil, 0
-- replID, replAt and failPause are what H says of failovers (epoch.go):
-- the replication ID a script last saw (false: none), when (nil: never),
-- and the end of the pause the last failover found declared.
local replID, replAt, failPause = false, nil, nil
-- heard reads the silence from H at now for a script with ttl (0: a
-- script that only reads: it honours a grace and declares none), and
-- sets cut (and what H says of failovers).
local function heard(H, now, ttl)
  local got = redis.call('HMGET', H, 'h', 'c', 'u', 'r', 'k', 'f')
  local h, c, u = tonumber(got[1]), tonumber(got[2]), tonumber(got[3])
  replID, replAt, failPause = got[4], tonumber(got[5]), tonumber(got[6])
  cut = now
  if c and u and u > now then cut, graceEnd = math.min(c, now), u end
  if ttl <= 0 then return end
  if h and h <= now and now - h > ttl / 2 then
    -- A silence that began inside a grace keeps the grace's start (the
    -- holders it held may not have reached Redis since), up to
    -- keepLeases after it, however many silences followed one another.
    local from = h
    if c and u and h < u and now - c <= keepLeases then from = math.min(c, h) end
    cut = from
    graceEnd = math.max(graceEnd, now + ttl)
    redis.call('HSET', H, 'h', string.format('%.0f', now), 'c', string.format('%.0f', cut), 'u', string.format('%.0f', graceEnd))
  elseif not h or h > now or now - h >= ttl / 16 then
    redis.call('HSET', H, 'h', string.format('%.0f', now))
  end
end
-- expiredBy returns the time up to which leases have expired at now.
local function expiredBy(now)
  if cut and cut < now then return cut end
  return now
end
`
