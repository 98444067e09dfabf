package redisstore

// lookBoundLua is the part of queueLua that a serving which goes on past
// its look bound (serveFrom with from > 0: a newcomer's look further, a
// release of several pairs on a key) reads: where the looks before it in
// the same script stopped, and the waiters of several keys they passed.
var lookBoundLua = `-- passedBefore holds, per key, the units of the waiters of several keys
-- (of live processes) that its serving passed from its head on, for the
-- length of a script: a serving that goes on from where one stopped short
-- at its look bound (from > 0) knows them, as one from the head does
-- (memstore's, which looks again from the head after each grant). A
-- serving from the head begins them anew.
local passedBefore = {}
-- passedBy holds, per key, the tickets of the waiters of several keys
-- that its serving passed over from its head on, for the length of a
-- script: the grants of a serving that goes on from where one stopped
-- short pass them too (passOver), as grants from the head do.
local passedBy = {}
-- lookedTo holds, per key, the member of the first waiter a serving that
-- stopped at its look bound did not look at, for the length of a script.
local lookedTo = {}
-- heavyPassed reports whether a waiter of several keys that serving k
-- passed (passedUnits: ticket to units), still queued there, has no room
-- left for its units, at most limit, at count: heavy, it keeps the room.
-- One no longer queued (granted through another of its keys since) is
-- forgotten.
local function heavyPassed(T, passedUnits, limit, count)
  for p, u in pairs(passedUnits) do
    if u > 1 and u <= limit and count + u > limit then
      if redis.call('HEXISTS', T, p) == 1 then return true end
      passedUnits[p] = nil
    end
  end
  return false
end
`
