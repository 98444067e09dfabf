package fleet

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the Redis server and take every time from
// its clock (TIME), never from a client's: the processes of a fleet need
// not agree on the time.
//
// Each capped key is a sorted set: member = lease id, score = the lease's
// expiry in server milliseconds. A key's own expiry follows its leases, so
// keys whose holders all died go away by themselves.

// acquireScript takes one lease on every key or on none.
//
//	KEYS: the capped keys, then the lease id's tombstone
//	ARGV: lease id, ttl ms, then each capped key's limit
//
// A lease id whose tombstone exists was abandoned (see abandonScript) and is
// refused. Otherwise it drops expired leases, then: if the lease is already
// on every key (a retried call), it renews it and admits; if any key is at
// its limit without this lease, it admits nothing; otherwise it adds the
// lease to every key. It returns {admitted (1, 0, or -1 for an abandoned
// id), index of the full key (1-based, 0 if none), its lease count, its
// earliest lease expiry (0 if none), now}, times in server milliseconds.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, ttl = ARGV[1], tonumber(ARGV[2])
local tomb = table.remove(KEYS)
if redis.call('EXISTS', tomb) == 1 then return {-1, 0, 0, 0, now} end
local held = 0
for _, k in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  if redis.call('ZSCORE', k, id) then held = held + 1 end
end
if held < #KEYS then
  for i, k in ipairs(KEYS) do
    local n = redis.call('ZCARD', k)
    if n >= tonumber(ARGV[2 + i]) and not redis.call('ZSCORE', k, id) then
      local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      local earliest = 0
      if first[2] then earliest = tonumber(first[2]) end
      return {0, i, n, earliest, now}
    end
  end
end
for _, k in ipairs(KEYS) do
  redis.call('ZADD', k, now + ttl, id)
  redis.call('PEXPIRE', k, ttl)
end
return {1, 0, 0, 0, now}
`)

// renewScript extends leases that still exist, in one call for many.
//
//	KEYS: for each (key, lease) pair, the capped key and the lease id's
//	      tombstone
//	ARGV: ttl ms, reassert (0/1), then the lease id of each pair
//
// A lease that is gone (released, expired, or lost with a Redis restart) is
// never extended; with reassert it is put back without a cap check, unless
// its id was abandoned (a late renewal must not bring back a lease released
// meanwhile). It returns the 1-based indexes of the pairs whose lease was
// gone.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, reassert = tonumber(ARGV[1]), ARGV[2] == '1'
local gone = {}
for i = 1, #KEYS / 2 do
  local k, tomb, id = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 + i]
  local score = redis.call('ZSCORE', k, id)
  if score and tonumber(score) > now then
    redis.call('ZADD', k, 'XX', now + ttl, id)
    redis.call('PEXPIRE', k, ttl)
  else
    if score then redis.call('ZREM', k, id) end
    gone[#gone + 1] = i
    if reassert and redis.call('EXISTS', tomb) == 0 then
      redis.call('ZADD', k, now + ttl, id)
      redis.call('PEXPIRE', k, ttl)
    end
  end
end
return gone
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
// A lease it removes from a key that was full publishes a wake-up, as a
// release does.
//
//	KEYS: the capped keys, then the lease id's tombstone
//	ARGV: lease id, ttl ms (how long the tombstone stays), the wake-up
//	      channel, then each key's limit (none: no wake-ups)
var abandonScript = redis.NewScript(`
local tomb = table.remove(KEYS)
for i, k in ipairs(KEYS) do
  if redis.call('ZREM', k, ARGV[1]) == 1 and ARGV[3 + i] and
     redis.call('ZCARD', k) + 1 >= tonumber(ARGV[3 + i]) then
    redis.call('PUBLISH', ARGV[3], k)
  end
end
redis.call('SET', tomb, '1', 'PX', ARGV[2])
return 0
`)
