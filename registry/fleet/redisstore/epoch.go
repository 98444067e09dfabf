package redisstore

// The epoch: a key per Registry name, <prefix>{<name>}#epoch (no key name
// can be it: capped keys have a ':' after the brace), holding the server's
// time, in microseconds, when a script first found it missing. It has no
// expiry, so it goes only when Redis loses its data (a restart without
// persistence, a failover to a replica without it, FLUSHALL): a new value
// tells a lease missing since it was last seen in Redis under the old one
// that Redis lost it, while a lease missing under the same epoch expired.
// The acquire and renew scripts set it when it is missing and return it.
//
// A failover keeps the epoch (the replica had it) but may lose the last
// writes before it, leases among them: those would look expired, and a
// newcomer would take their room before their live holders renew. So a
// failover pauses new admissions for a renewal round too, without a new
// epoch: #heard (silence.go) keeps the replication ID that INFO gave the
// last script to look (r) and when it looked (k, at most every
// replCheckMS), and a script that finds its server's former ID
// (master_replid2) to be r, a replica promoted from the server before,
// declares the pause from now and marks it a failover's (f). Under the
// same epoch, the holders' missing leases go back only if there is room,
// as after an expiry, and in a failover's pause, unlike a loss's, they
// may: the room is theirs, since newcomers wait. A lease that had expired
// before the failover, its room taken, stays out. A failover inside a
// pause makes it end no sooner than a pause of its own would; one inside
// a loss's pause leaves it a loss's. A restart under a new ID (Redis 7
// takes one at each start), or a Cluster slot moved to another master, is
// no failover: nothing was lost. But a master that has had replicas and
// restarts from its snapshot comes back with its old ID as its former
// one, which the scripts cannot tell from a failover: new admissions then
// wait a renewal round for nothing (a snapshot older than the last lease
// may have lost it, too). A failover is missed if the new server's clock
// reads within replCheckMS of the last look (failovers take longer), if
// no script ran on a server between (A to B to C, B gone before any call
// reached it), or if INFO cannot be run (an ACL without it: k is still
// written, so that it is tried at most every replCheckMS). A release or
// an abandon with a TTL looks too, and serves no queue when it finds a
// failover: a waiter would take the room a lost lease had (those of the
// release before, and calls without a TTL, do not look).
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

// failoverLua finds a failover and declares its pause (release and
// abandon scripts include it alone). It follows baseLua.
const failoverLua = `
local replCheckMS = 10
-- failedOver reports whether the server that runs the script is a replica
-- promoted from the one that ran the last script to look: its former
-- replication ID (master_replid2) is the one that script saw (replID,
-- read by heard). It looks at most every replCheckMS, and writes what it
-- finds in H: the ID (r) and when it looked (k, also when INFO gave none).
local function failedOver(H, now)
  if replAt and replAt <= now and now - replAt < replCheckMS then return false end
  local info = redis.pcall('INFO', 'replication')
  local id, former
  if type(info) == 'string' then
    id, former = string.match(info, 'master_replid:(%x+)'), string.match(info, 'master_replid2:(%x+)')
  end
  if not id then
    redis.call('HSET', H, 'k', string.format('%.0f', now))
    return false
  end
  redis.call('HSET', H, 'r', id, 'k', string.format('%.0f', now))
  return replID ~= false and replID ~= id and replID == former
end
-- failoverPause declares the pause of a failover found at now and
-- returns its end, paused being the end of the one declared (nil: none).
-- The replica may lack the latest leases: new admissions wait one renewal
-- round from now (pause, or ttl/2 without one), while the holders put
-- theirs back; a pause under way (a failover's, replicated) ends no
-- sooner. One of a loss stays a loss's: its holders' leases go back
-- unchecked, and a checked one must not take their room.
local function failoverPause(H, now, pauseKey, paused, pause, ttl)
  local p = pause
  if p <= 0 then p = ttl / 2 end
  local untilT = now + math.max(1, math.min(p, ttl))
  local loss = paused and paused > now and paused ~= failPause
  if not paused or untilT > paused then
    redis.call('SET', pauseKey, string.format('%.0f', untilT), 'PX', string.format('%.0f', untilT - now))
    paused = untilT
  end
  if not loss then
    redis.call('HSET', H, 'f', string.format('%.0f', paused))
    failPause = paused
  end
  return paused
end
-- servesAfterFailover is the start of a release or an abandon, which
-- serve queues: it reports whether they may, having declared the pause of
-- a failover it finds (only with ttl > 0: a call without a TTL does not
-- look, as its pause's bound is unknown).
local function servesAfterFailover(H, now, pauseKey, pause, ttl)
  if ttl > 0 and failedOver(H, now) then
    failoverPause(H, now, pauseKey, tonumber(redis.call('GET', pauseKey)), pause, ttl)
    return false
  end
  return redis.call('EXISTS', pauseKey) == 0
end
`

// epochLua is the start the acquire and renew scripts share: it reads the
// epoch, making it if missing, declares the pause if the caller saw
// another epoch or the server failed over, and returns the epoch and the
// time until which new admissions are paused (0: not paused). It follows
// baseLua; call it after now is known.
const epochLua = failoverLua + `
local maxPauseMS, unlimited = 300000, 9e18
-- epochOf returns the epoch, the end of the pause of new admissions (0:
-- none) and whether that pause is a failover's (renewals then put leases
-- back if there is room).
local function epochOf(t, now, epochKey, pauseKey, known, pause, ttl, H)
  local got = redis.call('MGET', epochKey, pauseKey)
  local epoch, paused = tonumber(got[1]), tonumber(got[2])
  if not epoch then
    epoch = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', epochKey, string.format('%.0f', epoch))
  end
  local born = math.floor(epoch / 1000)
  if failedOver(H, now) then
    paused = failoverPause(H, now, pauseKey, paused, pause, ttl)
  elseif known > 0 and known ~= epoch and pause > 0 and not got[2] then
    local untilT = born + math.min(pause, ttl)
    if untilT > now then
      redis.call('SET', pauseKey, string.format('%.0f', untilT), 'PX', string.format('%.0f', untilT - now))
      paused = untilT
    end
  end
  if not paused then return epoch, 0, false end
  -- No pause our scripts declare ends later than a TTL after the birth
  -- (a failover's: after now); one that does, or that a server clock
  -- stepped back has moved far ahead of now, is not honoured.
  local failover = paused == failPause
  local bound = math.max(ttl, maxPauseMS)
  if not failover and paused > born + bound or paused > now + bound then return epoch, 0, false end
  return epoch, paused, failover
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
