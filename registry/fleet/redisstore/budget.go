package redisstore

import (
	"context"
	"crypto/rand"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A budget per minute is a hash, <prefix>{<name>}#budget:<key>: a field
// per step (the server's seconds) that holds "<all>,<input>,<output>", the
// tokens charged in it. Steps older than the window are deleted as the
// script meets them, and the hash expires a little after its latest step
// has left the window.
//
// A call is run once: a client sends it again when its connection breaks
// before the reply (go-redis's MaxRetries), and a charge or a take-back
// run twice would count twice. Each call has an id of its own; one that
// may change the budget (a cost, refused or not) keeps its reply in
// <prefix>{<name>}#budgetcall:<id> (ARGV[10] ms, past the call's
// deadline), and the same call again gets that reply and changes nothing:
// a refusal too, whose first sending may reach the server after its retry
// ran. A read (no cost) or a check (ARGV[11]) keeps nothing: it changes
// nothing, and run again, it answers anew.
var budgetScript = redis.NewScript(`
local seen = redis.call('GET', KEYS[2])
if seen then
  local r = {}
  for v in string.gmatch(seen, '[^,]+') do r[#r + 1] = tonumber(v) end
  return r
end
local check = ARGV[11] == '1'
local keep = not check and (ARGV[6] ~= '0' or ARGV[7] ~= '0' or ARGV[8] ~= '0')
local function done(r)
  if keep then
    local f = {}
    for i, v in ipairs(r) do f[i] = string.format('%d', v) end
    redis.call('SET', KEYS[2], table.concat(f, ','), 'PX', tonumber(ARGV[10]))
  end
  return r
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local correct = ARGV[1] == '1' and not check
local step = tonumber(ARGV[2])
local limits = {tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])}
local cost = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])}
local raw = redis.call('HGETALL', KEYS[1])
-- A clock set back does not move the window back: it stays at the
-- latest step charged.
local cur = math.floor(now / 1000)
for i = 1, #raw, 2 do
  local st = tonumber(raw[i])
  if st and st > cur then cur = st end
end
local first = cur - 60
local counts, used = {}, {0, 0, 0}
for i = 1, #raw, 2 do
  local st = tonumber(raw[i])
  local a, b, c = string.match(raw[i + 1], '^(%-?%d+),(%-?%d+),(%-?%d+)$')
  if not st or not a or st < first then
    redis.call('HDEL', KEYS[1], raw[i])
  else
    local v = {tonumber(a), tonumber(b), tonumber(c)}
    counts[st] = v
    for p = 1, 3 do used[p] = used[p] + v[p] end
  end
end
-- add adds d to step st, taking no part below zero (what a lost store
-- forgot is not given back); no change (a read) writes nothing.
local function add(st, d)
  local v = counts[st] or {0, 0, 0}
  local changed = false
  for p = 1, 3 do
    local n = math.max(v[p] + d[p], 0)
    if n ~= v[p] then changed = true end
    used[p] = used[p] + n - v[p]
    v[p] = n
  end
  if not changed then return end
  counts[st] = v
  redis.call('HSET', KEYS[1], st, string.format('%d,%d,%d', v[1], v[2], v[3]))
  redis.call('PEXPIRE', KEYS[1], math.max((cur + 62) * 1000 - now, 62000))
end
if ARGV[9] == '1' and not check then -- a move
  if step ~= cur then
    if step >= first then add(step, {-cost[1], -cost[2], -cost[3]}) end
    add(cur, cost)
  end
  return done({1, cur, used[1], used[2], used[3], 0, 0, now})
end
if correct then
  if step >= first and step <= cur then
    add(step, cost)
  else
    add(cur, {math.max(cost[1], 0), math.max(cost[2], 0), math.max(cost[3], 0)})
  end
  return done({1, cur, used[1], used[2], used[3], 0, 0, now})
end
local fits = true
for p = 1, 3 do
  if limits[p] > 0 and used[p] > 0 and used[p] + cost[p] > limits[p] then fits = false end
end
if fits and not check then
  add(cur, cost)
  return done({1, cur, used[1], used[2], used[3], 0, 0, now})
end
local at, binding = 0, 0
for p = 1, 3 do
  local l = limits[p]
  if l > 0 and used[p] > 0 and used[p] + cost[p] > l then
    local left = used[p]
    for st = first, cur do
      local v = counts[st]
      if v then left = left - v[p] end
      if left <= 0 or left + cost[p] <= l then
        local when = (st + 61) * 1000
        if when > at then at, binding = when, p - 1 end
        break
      end
    end
  end
end
return done({0, cur, used[1], used[2], used[3], at, binding, now})
`)

// budgetCallKept is how long a budget call's reply is kept at least (see
// budgetScript).
const budgetCallKept = 10 * time.Second

// Budget runs the budget's script. A client of a release before checks
// runs the script it knows (each is loaded by its text's hash), so both
// work on the same server.
func (s *Store) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	flag := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	// The id's reply is kept past the latest a client may send the call
	// again: its deadline (go-redis sends no retry past it), within a
	// minute (a retry comes within its backoff of the break).
	keep := budgetCallKept
	if d, ok := ctx.Deadline(); ok {
		keep = min(max(keep, time.Until(d)+time.Second), time.Minute)
	}
	res, err := budgetScript.Run(ctx, s.rdb, []string{s.budgetPrefix + c.Key, s.budgetCallPrefix + rand.Text()}, flag(c.Correct), c.Step,
		c.Limits[0], c.Limits[1], c.Limits[2], c.Cost[0], c.Cost[1], c.Cost[2], flag(c.Correct && c.Move), keep.Milliseconds(), flag(c.Check)).Int64Slice()
	if err != nil {
		return driver.BudgetResult{}, err
	}
	return driver.BudgetReply(res)
}
