package fleet

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the Redis server and take every time from
// its clock (TIME), never from a client's: the processes of a fleet need
// not agree on the time.
//
// Each capped key is a sorted set: member = lease id, score = the lease's
// expiry in server milliseconds. A key's own expiry is its latest lease's:
// a lease added or extended sets it only if it would come later (processes
// with different TTLs share keys). Keys whose holders all died go away by
// themselves.

// The epoch: a key per Registry name, <prefix>{<name>}#epoch (no key name
// can be it: capped keys have a ':' after the brace), holding the server's
// time, in microseconds, when a script first found it missing. It has no
// expiry, so it goes only when Redis loses its data (a restart without
// persistence, a failover to a replica without it, FLUSHALL): a new value
// tells a lease missing since it was last seen in Redis under the old one
// that Redis lost it, while a lease missing under the same epoch expired.
// The acquire and renew scripts set it when it is missing and return it.
//
// The pause: when Redis has lost its data, the leases of live holders are
// missing until each holder's next renewal puts its lease back (without a
// cap check: the holder is still working). Admitting new leases into the
// empty keys meanwhile would let in up to the cap again on top of them. So
// new admissions wait for one renewal round: <prefix>{<name>}#pause holds
// the server time (ms) before which the acquire script admits no new lease,
// expiring then. Renewals, put-backs without a check and carried leases are
// exempt: they are the live holders coming back.
//
// Redis cannot tell a loss from a first start: both leave no key. A caller
// can: it sends the epoch it last saw (0: none yet), and a script that
// finds another one declares the pause, unless declared already, until the
// epoch's birth plus the pause the caller sends (its renewal interval plus
// a margin; 0 from a caller that puts no lost lease back). Counted from
// the birth, not from the call, so that a caller that learns of the loss
// late (the epoch was made by a process that had not seen the old one)
// pauses only what is left of the round, and one that learns of it after
// the round pauses nothing. A second loss inside the round makes a new
// epoch, and a new pause from its birth.
//
// A pause is honoured up to its end, which no declaration puts later than
// the declarer's TTL after the epoch's birth (a lease not renewed for a
// TTL would have expired anyway), so that processes with other TTLs wait
// alike. An end more than the larger of the caller's TTL and 5 minutes
// after the birth, or from now (a server clock stepped back), is not
// honoured at all: no value in the key holds a caller for long. A call
// whose keys are all at slots.Unlimited is not paused: there is no cap to
// keep.

// epochLua is the start the acquire and renew scripts share: it reads the
// epoch, making it if missing, declares the pause if the caller saw
// another epoch, and returns the epoch and the time until which new
// admissions are paused (0: not paused). Call it after now is known.
const epochLua = `
local maxPauseMS, unlimited = 300000, 9e18
-- A key expires with its latest lease, never sooner: a lease of a
-- process with a longer TTL (a rolling deploy that changes WithLeaseTTL)
-- may be in it.
local function cover(k, ttl)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
local function epochOf(t, now, epochKey, pauseKey, known, pause, ttl)
  local epoch = tonumber(redis.call('GET', epochKey))
  if not epoch then
    epoch = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', epochKey, string.format('%.0f', epoch))
  end
  local born = math.floor(epoch / 1000)
  if known > 0 and known ~= epoch and pause > 0 and redis.call('EXISTS', pauseKey) == 0 then
    local untilT = born + math.min(pause, ttl)
    if untilT > now then
      redis.call('SET', pauseKey, string.format('%.0f', untilT), 'PX', string.format('%.0f', untilT - now))
    end
  end
  local paused = tonumber(redis.call('GET', pauseKey))
  if not paused then return epoch, 0 end
  -- No pause our scripts declare ends later than a TTL after the birth;
  -- one that does, or that a server clock stepped back has moved far
  -- ahead of now, is not honoured.
  local bound = math.max(ttl, maxPauseMS)
  if paused > born + bound or paused > now + bound then return epoch, 0 end
  return epoch, paused
end
-- capped reports whether any of the n limits from ARGV[first] on binds:
-- a key at slots.Unlimited takes no part in a pause.
local function capped(first, n)
  for i = 0, n - 1 do
    if tonumber(ARGV[first + i]) < unlimited then return true end
  end
  return false
end
`

// The fixed keys and arguments of an acquire call, before its capped keys
// and their limits.
const (
	acquireKeys = 3
	acquireArgs = 6
)

// acquireScript takes one lease on every key or on none.
//
//	KEYS: the epoch key, the pause key, the lease id's tombstone, the n
//	      capped keys, then for each carried (key, lease) pair the key and
//	      the lease id's tombstone
//	ARGV: lease id, ttl ms, n, the call's not-after time (0: none), the
//	      epoch the caller last saw (0: none), the pause ms it declares,
//	      each capped key's limit, then the lease id of each carried pair
//
// Past its not-after time (see clock.go) it refuses to run, and changes
// nothing. Otherwise it first puts in the carried pairs, without a cap
// check, unless their tombstone exists: leases this process admitted while
// Redis was unreachable and that share a key with this admission, so that
// they count against it. A lease id whose tombstone exists was abandoned
// (see abandonScript) and is refused. Otherwise it drops expired leases,
// then: if the lease is already on every key (a retried call), it renews it
// and admits; while new admissions are paused, it admits nothing; if any
// key is at its limit without this lease, it admits nothing; otherwise it
// adds the lease to every key. It returns {admitted (1; 0 for a full key;
// acquirePaused; -1 for an abandoned id; or tooLate), index of the full key
// (1-based, 0 if none), its lease count (the first key's if paused), its
// earliest lease expiry (the pause's end if paused; 0 if none), now, epoch
// (0 if too late)}, times in server milliseconds.
var acquireScript = redis.NewScript(epochLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local notAfter = tonumber(ARGV[4])
if notAfter > 0 and now > notAfter then return {-2, 0, 0, 0, now, 0} end
local id, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local epoch, paused = epochOf(t, now, KEYS[1], KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]), ttl)
for j = 1, (#KEYS - 3 - n) / 2 do
  local k, tomb = KEYS[2 + n + 2 * j], KEYS[3 + n + 2 * j]
  if redis.call('EXISTS', tomb) == 0 then
    redis.call('ZADD', k, now + ttl, ARGV[6 + n + j])
    cover(k, ttl)
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1, 0, 0, 0, now, epoch} end
local held = 0
for i = 1, n do
  local k = KEYS[3 + i]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  if redis.call('ZSCORE', k, id) then held = held + 1 end
end
if held < n and paused > now and capped(7, n) then
  return {2, 0, redis.call('ZCARD', KEYS[4]), paused, now, epoch}
end
if held < n then
  for i = 1, n do
    local k = KEYS[3 + i]
    local c = redis.call('ZCARD', k)
    if c >= tonumber(ARGV[6 + i]) and not redis.call('ZSCORE', k, id) then
      local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      local earliest = 0
      if first[2] then earliest = tonumber(first[2]) end
      return {0, i, c, earliest, now, epoch}
    end
  end
end
for i = 1, n do
  local k = KEYS[3 + i]
  redis.call('ZADD', k, now + ttl, id)
  cover(k, ttl)
end
return {1, 0, 0, 0, now, epoch}
`)

// What the acquire script returns first, besides 1 (admitted) and 0 (a key
// is full).
const (
	// acquirePaused: new admissions are paused after Redis lost its data,
	// until the time it returns fourth.
	acquirePaused = 2
	// tooLate: it refused to run past its not-after time. The renew script
	// returns it too.
	tooLate = -2
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
//	      and its tombstone
//	ARGV: ttl ms, the call's not-after time (0: none), the epoch the caller
//	      last saw (0: none), the pause ms it declares, then for each
//	      lease: its id, its mode, the epoch under which it was last known
//	      to be in Redis (0: not known to be), its number of keys n, and
//	      each key's limit
//
// Past its not-after time (see clock.go) it refuses to run, changes
// nothing and returns {tooLate, now}. Otherwise:
//
// A lease that is gone from a key (released, expired, or lost with Redis's
// data) is never extended there. With the mode putBack it is put back
// without a cap check, and with reassert too if the epoch is not the one it
// was last seen under (Redis lost it); with reassert under the same epoch
// (it expired), or if it was not known to be in Redis (it was lost before),
// it is put back only if every key it is missing from has room by its
// limit, and new admissions are not paused (it would be one), else on
// none. Nothing is put back whose tombstone exists (a late renewal must not
// bring back a lease released meanwhile). It returns the epoch, now (server
// milliseconds), then each lease's status.
var renewScript = redis.NewScript(epochLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local notAfter = tonumber(ARGV[2])
if notAfter > 0 and now > notAfter then return {-2, now} end
local ttl = tonumber(ARGV[1])
local epoch, paused = epochOf(t, now, KEYS[1], KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ttl)
local out = {epoch, now}
local a, k = 5, 3
while a <= #ARGV do
  local id, mode, known, n = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local missing = {}
  for i = 0, n - 1 do
    local key = KEYS[k + i]
    local score = redis.call('ZSCORE', key, id)
    if score and tonumber(score) > now then
      redis.call('ZADD', key, 'XX', now + ttl, id)
      cover(key, ttl)
    else
      if score then redis.call('ZREM', key, id) end
      missing[#missing + 1] = i
    end
  end
  local status = 0
  if #missing > 0 then
    status = 3
    if mode > 0 and redis.call('EXISTS', KEYS[k + n]) == 0 then
      local checked = mode == 1 and (known == 0 or known == epoch)
      local room = not (checked and paused > now and capped(a + 4, n))
      if checked and room then
        for _, i in ipairs(missing) do
          local key = KEYS[k + i]
          redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
          if redis.call('ZCARD', key) >= tonumber(ARGV[a + 4 + i]) then room = false end
        end
      end
      if room then
        for _, i in ipairs(missing) do
          redis.call('ZADD', KEYS[k + i], now + ttl, id)
          cover(KEYS[k + i], ttl)
        end
        status = 1
        if checked then status = 2 end
      end
    end
  end
  out[#out + 1] = status
  a = a + 4 + n
  k = k + n + 1
end
return out
`)

// releaseScript removes leases and publishes a wake-up for each key that
// was full before (only then can anyone be waiting for it).
//
//	KEYS: capped keys, one per (key, lease) pair
//	ARGV: the wake-up channel, then the lease id and the key's limit of
//	each pair
var releaseScript = redis.NewScript(`
for i, k in ipairs(KEYS) do
  if redis.call('ZREM', k, ARGV[2 * i]) == 1 and
     redis.call('ZCARD', k) + 1 >= tonumber(ARGV[2 * i + 1]) then
    redis.call('PUBLISH', ARGV[1], k)
  end
end
return 0
`)

// abandonScript takes back what an acquire call that failed on the client's
// side (a timeout, a cancelled context) may still do on the server: it
// removes the lease id from the keys and leaves a tombstone, so that the
// call, if it runs later, adds nothing.
//
// The tombstone stays for the TTL, and at least until the latest not-after
// time of the calls that may add the lease. A lease it removes from a key
// that was full publishes a wake-up, as a release does.
//
//	KEYS: the capped keys, then the lease id's tombstone
//	ARGV: lease id, ttl ms, the calls' latest not-after time (0: none), the
//	      wake-up channel, then each key's limit (none: no wake-ups)
var abandonScript = redis.NewScript(`
local tomb = table.remove(KEYS)
for i, k in ipairs(KEYS) do
  if redis.call('ZREM', k, ARGV[1]) == 1 and ARGV[4 + i] and
     redis.call('ZCARD', k) + 1 >= tonumber(ARGV[4 + i]) then
    redis.call('PUBLISH', ARGV[4], k)
  end
end
local stay = tonumber(ARGV[2])
local latest = tonumber(ARGV[3])
if latest > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  stay = math.max(stay, latest - now + 1)
end
redis.call('SET', tomb, '1', 'PX', string.format('%.0f', stay))
return 0
`)
