package redisstore

// The queue's summary spares a newcomer most of that look where no
// waiter fits the room (noneFits): it may pass the head unless a waiter
// behind it is of several keys or at its pass bound, and reading each
// waiter's fields to know cost some 400 µs of the server's time per call
// at 63 waiters. So <k>#v keeps x, the number of queued tickets that are
// of several keys (k| names more than one) or have been charged at all
// (u| exists: a charge below the bound counts too, so that whatever
// charges a ticket later changes nothing the summary says); a newcomer
// that finds none but the head (whose fields it reads anyway) passes
// without reading the others, and else reads them as before. Every
// script that changes the queue keeps x: enqueue, unqueue (a grant, a
// withdrawal, an abandon, a dead process's ticket dropped), charge, and a
// ticket's call that writes its keys. The summary goes with the queue: it
// begins with the queue's first ticket (xi) and is deleted with the
// queue's keys when the last one leaves; a store that lost its data, or
// an eviction, loses it with the queue, or alone, and then it is not
// trusted (an eviction that takes the queue and its hash of counts but
// leaves <k>#t leaves a waiter's fields, u| with them: its next call
// queues it again, and enqueue counts it by the fields it has). Limits
// are not in it (a waiter over the caller's limit, which the look leaves
// out, is counted: the look is made then), and it is kept in the key's
// hash slot, with the queue.
//
// A script of the release before keeps no summary, and may run beside
// this release's in a rolling deploy (or after a rollback): so the
// summary is trusted only as this release left it. xs counts the tickets
// this release queued since the summary began, beside the queue's
// sequence (seq), which every release counts, and xe the fields of
// <k>#t plus 2^24 per member of <k>#q as this release changed them.
// Whatever a script of the release before does that changes what x should
// say changes one of them: it queues (seq), takes a ticket out (the
// queue's length, which only its queueing, told by seq, could make up
// for), or charges a ticket for the first time (a new field in <k>#t, as
// a first pass over does; later charges change no answer, above). So a
// summary is trusted only if xi exists, xs is seq and xe is what it
// counts: else the newcomer reads the waiters, until the queue empties
// and a new summary begins.

// summaryLua is the part of queueLua that keeps a pass over waiters
// (charge) and answers a newcomer's look where no waiter fits the room
// (noneFits), with the queue's summary (clearBehind).
var summaryLua = `-- charge counts units of a waiter of flow and rank (its queue member's
-- prefix) granted past blocker, queued in T (driver.Pass), and reports
-- whether blocker has been passed its bound now.
local function charge(T, blocker, flow, rank, units)
  local f = redis.call('HMGET', T, blocker, 'f|' .. blocker, 'k|' .. blocker, 'w|' .. blocker)
  local m = f[1]
  if not m then return false end
  if flow ~= (f[2] or '') or tostring(rank) ~= string.match(m, '^(%d+)|') then
    units = units * 2 * passFactor
  end
  local past = redis.call('HINCRBY', T, 'u|' .. blocker, units)
  if past == units then
    -- A field new to T, and a ticket charged: the summary follows.
    local V = string.sub(T, 1, -3) .. '#v'
    redis.call('HINCRBY', V, 'xe', 1)
    if not marked(f[3], nil) then redis.call('HINCRBY', V, 'x', 1) end
  end
  return past >= passFactor * (tonumber(f[4]) or 1)
end
-- clearBehind reports whether k's summary says that no ticket queued
-- behind its head counts in x (head: whether the head does), and is to be
-- trusted: written by this release since the queue began (xi), and no
-- script of a release before has changed the queue since (xs is the
-- sequence, xe the length of T and Q); n is the length of Q. False sends
-- the caller to the walk.
local function clearBehind(Q, T, V, n, head)
  local s = redis.call('HMGET', V, 'xi', 'x', 'xe', 'xs', 'seq')
  local x, xe, xs = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
  if not s[1] or not x or not xs or xs ~= tonumber(s[5]) then return false end
  if xe ~= redis.call('HLEN', T) + summaryLen * n then return false end
  if head then return x == 1 end
  return x == 0
end
-- noneFits answers for serve, at the cost of a few looks, where no
-- ticket queued on k fits its room (the least units among them, <k>#m,
-- are more than it has): -1 if the head keeps the room, 0 and the head if
-- it is a heavy waiter that a newcomer within passScan places may pass;
-- nil where serving must look (a dead head, one over the limit, tickets
-- <k>#m does not count: queued by a release before it). Dead processes'
-- tickets behind the head wait for a serving that walks to them, which
-- comes as soon as a queued ticket fits.
local function noneFits(k, Q, T, limit, count, now, P, claim)
  local least = redis.call('ZRANGE', k .. '#m', 0, 0, 'WITHSCORES')
  if not least[2] or count + tonumber(least[2]) <= limit then return nil end
  local n = redis.call('ZCARD', Q)
  if redis.call('ZCARD', k .. '#m') ~= n then return nil end
  local m = redis.call('ZRANGE', Q, 0, 0)[1]
  local ticket = string.match(m, '|([^|]+)$')
  local kl, units, past = ticketKeys(T, ticket, k, limit)
  if units > limit or dead(P, m, now, claim) then return nil end
  if #kl == 1 and past < passFactor * units and n <= scanMax then
    -- A newcomer may pass the head, unless serving, past it, would stop
    -- at a heavy waiter behind it: one of several keys, or one passed its
    -- bound already. Serving looks then. The queue's summary answers
    -- where it says no ticket behind the head is of several keys or
    -- charged at all; else (or with no summary to trust) the look reads
    -- them.
    local rest = {}
    if n > 1 and not clearBehind(Q, T, k .. '#v', n, past > 0) then rest = redis.call('ZRANGE', Q, 1, -1) end
    if #rest > 0 then
      local fields = {}
      for j, w in ipairs(rest) do
        local id = string.match(w, '|([^|]+)$')
        fields[3 * j - 2], fields[3 * j - 1], fields[3 * j] = 'k|' .. id, 'w|' .. id, 'u|' .. id
      end
      local meta = redis.call('HMGET', T, unpack(fields))
      for j = 1, #rest do
        local u, p = tonumber(meta[3 * j - 1]) or 1, tonumber(meta[3 * j]) or 0
        if u <= limit and ((meta[3 * j - 2] and string.find(meta[3 * j - 2], '],[', 1, true)) or p >= passFactor * u) then
          return nil
        end
      end
    end
    return 0, ticket
  end
  return -1 -- nobody queued fits, and a newcomer is past serving's places
end`
