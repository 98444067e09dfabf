package redisstore

// urgentLua is the part of queueLua that keeps places for urgent tickets:
// tickets of several keys passed over registry.MaxPassed times (see
// PROTOCOL.md), among which a ticket with a key paused is not.
const urgentLua = `
-- paused reports whether a key of kl has a limit of 0: a ticket on it
-- cannot be served until that is raised.
local function paused(kl)
  for _, e in ipairs(kl) do
    if tonumber(e[2]) == 0 then return true end
  end
  return false
end
-- roomFor returns the units k has, under limit, for ticket, which
-- arrived at arrival (both nil: a newcomer): its free units, less those
-- kept for k's oldest urgent ticket (its units) unless that is ticket or
-- came later. An urgent ticket no longer queued, or whose process is dead,
-- is dropped first; past scanMax of them, one unit is kept. (A ticket with
-- a key paused is not among the urgent ones: see urge.) count is k's
-- count where the caller has it (serve), else nil.
local function roomFor(k, limit, ticket, arrival, now, P, claim, count)
  if not count then
    expire(k, now)
    count = countOf(k)
  end
  local free = limit - count
  if free <= 0 then return free end
  for _ = 1, scanMax do
    local oldest = redis.call('ZRANGE', k .. '#u', 0, 0, 'WITHSCORES')
    if not oldest[1] then return free end
    local f = redis.call('HMGET', k .. '#t', oldest[1], 'w|' .. oldest[1])
    if not f[1] then
      redis.call('ZREM', k .. '#u', oldest[1])
    elseif dead(P, f[1], now, claim) then
      drop(k, limit, oldest[1])
    else
      -- Its units are kept, unless over the limit: it cannot be served
      -- under it (its process refuses it).
      local units = tonumber(f[2]) or 1
      if oldest[1] ~= ticket and (not arrival or tonumber(oldest[2]) < arrival) and units <= limit then free = free - units end
      return free
    end
  end
  return free - 1
end
-- urge makes ticket, queued on k with its keys kl, one of k's urgent
-- tickets (by arrival) once it has been passed over maxPassed times, but
-- not while a key of kl is paused: it cannot be served then, and a place
-- kept for it would idle k (its process's calls, which send kl, put it
-- back once the pause is lifted).
local function urge(k, ticket, kl)
  local Q, T = qkeys(k)
  local U = k .. '#u'
  if paused(kl) then
    redis.call('ZREM', U, ticket)
  elseif (tonumber(redis.call('HGET', T, 'p|' .. ticket)) or 0) >= maxPassed then
    redis.call('ZADD', U, tonumber(redis.call('HGET', T, 'a|' .. ticket)) or 0, ticket)
    cover(U, redis.call('PTTL', Q))
  end
end
-- passOver counts a grant on k that passed ticket over: at maxPassed it is
-- one of k's urgent tickets (see urge). It returns the count.
local function passOver(k, ticket)
  local Q, T, V = qkeys(k)
  local passes = redis.call('HINCRBY', T, 'p|' .. ticket, 1)
  if passes == 1 then redis.call('HINCRBY', V, 'xe', 1) end -- a field new to T (see clearBehind)
  if passes == maxPassed then
    urge(k, ticket, keysOf(redis.call('HGET', T, 'k|' .. ticket), nil, nil, k, 9e18))
  end
  return passes
end
`
