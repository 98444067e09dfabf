package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/redis/go-redis/v9"
)

// The fleet's queue: one order for the waiters of every process on a
// capped key, kept in Redis beside the key's leases, and a hand-off of
// freed capacity to its head. It is the part of fleet-wide waits that runs
// on the server; Acquire does not use it yet (it polls, see Waiting in the
// package documentation).
//
// A waiter is a ticket: the lease id it will hold. Its place is a member of
// <key>#q, a sorted set whose members all score 0 and so sort by their
// bytes: the priority class's rank, then the start tag of start-time fair
// queuing between flows, then an arrival number, then the ticket's process
// and the ticket. So the head is the first waiter of the highest class,
// flows take turns in proportion to their weights (a flow's next start tag
// is its last one plus 1/weight, and no earlier than the virtual time, the
// start tag of the last ticket granted), and a flow's waiters keep their
// order. <key>#t maps each queued ticket to its member and its flow;
// <key>#v holds the virtual time, each flow's last start tag and queued
// count, and the arrival counter; it is deleted when the queue empties, so
// tags start from 0 after every backlog.
//
// Every script that may free capacity on the key, or finds it free, serves
// the queue first: it drops expired leases and, while the key has room,
// grants the head a lease of the claim window's length and publishes its
// ticket on its process's channel (<prefix>{<name>}#wake:<process>), so
// that only that process wakes. The waiter claims its grant by running the
// admit script again, which extends the lease to the full TTL. A waiter
// that died or went slow costs the key at most the claim window; a head
// whose process has missed its liveness deadline (<prefix>{<name>}#procs,
// process to deadline in server milliseconds, renewed by each process's
// heartbeat) is dropped, not granted, so a killed process's tickets delay
// no one by more than the liveness TTL. A newcomer never passes a queued
// waiter: the key can have room after serving only if nobody is queued.

// queueLua is the part the queue's scripts share.
const queueLua = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function cover(k, ttl)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
-- unqueue takes ticket (member m) out of the queue, with its flow's count.
local function unqueue(Q, T, V, m, ticket)
  redis.call('ZREM', Q, m)
  local flow = redis.call('HGET', T, 'f|' .. ticket)
  redis.call('HDEL', T, ticket, 'f|' .. ticket)
  if flow then redis.call('HINCRBY', V, 'n|' .. flow, -1) end
end
-- serve grants the queue's heads while K has room under limit.
local function serve(K, Q, T, V, P, limit, claim, now, chans)
  redis.call('ZREMRANGEBYSCORE', K, '-inf', now)
  while redis.call('ZCARD', K) < limit do
    local head = redis.call('ZRANGE', Q, 0, 0)
    if #head == 0 then break end
    local m = head[1]
    local tag, proc, ticket = string.match(m, '^%d+|([^|]+)|%d+|([^|]*)|(.+)$')
    unqueue(Q, T, V, m, ticket)
    local alive = tonumber(redis.call('HGET', P, proc))
    if alive and alive > now then
      redis.call('ZADD', K, now + claim, ticket)
      cover(K, claim)
      redis.call('HSET', V, 'V', tag)
      redis.call('PUBLISH', chans .. proc, ticket)
    end
  end
  if redis.call('ZCARD', Q) == 0 then redis.call('DEL', V) end
end
local K, Q, T, V, P = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
`

// Statuses of the queue's admit script.
const (
	queueRefused  = 0 // full, and the caller does not wait
	queueAdmitted = 1 // the ticket holds a lease of the full TTL
	queueWaiting  = 2 // the ticket is queued
	queueFull     = 3 // the queue is at its bound
	queueFlowFull = 4 // the caller's flow is at its bound in the queue
)

// queueAdmitScript admits a ticket, claims its grant, or queues it.
//
//	KEYS: the capped key, its #q, #t and #v, the name's #procs
//	ARGV: ticket, ttl ms, limit, claim ms, wait (0 or 1), class rank, flow,
//	      flow weight, process, channel prefix, queue bound, flow bound
//	      (bounds: 0 for none)
//
// It serves the queue, then: a ticket that holds a lease (its grant, or a
// retried call) has it extended to the TTL and is admitted; a ticket still
// queued is told so; a newcomer takes a lease if the key has room (then
// nobody is queued), else is refused, or, if it waits, queued unless a
// bound says no. It returns {status, the key's lease count, the queue's
// length, the key's earliest lease expiry (0: none), now}, times in server
// milliseconds.
var queueAdmitScript = redis.NewScript(queueLua + `
local ticket, ttl, limit, claim = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
serve(K, Q, T, V, P, limit, claim, now, ARGV[10])
if redis.call('ZSCORE', K, ticket) then
  redis.call('ZADD', K, 'XX', now + ttl, ticket)
  cover(K, ttl)
  return {1, redis.call('ZCARD', K), redis.call('ZCARD', Q), 0, now}
end
local queued = redis.call('ZCARD', Q)
local count = redis.call('ZCARD', K)
if redis.call('HEXISTS', T, ticket) == 1 then return {2, count, queued, 0, now} end
if count < limit then
  redis.call('ZADD', K, now + ttl, ticket)
  cover(K, ttl)
  return {1, count + 1, queued, 0, now}
end
local first = redis.call('ZRANGE', K, 0, 0, 'WITHSCORES')
local earliest = 0
if first[2] then earliest = tonumber(first[2]) end
if ARGV[5] ~= '1' then return {0, count, queued, earliest, now} end
local maxQ, maxF, flow = tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[7]
if maxQ > 0 and queued >= maxQ then return {3, count, queued, earliest, now} end
if maxF > 0 and (tonumber(redis.call('HGET', V, 'n|' .. flow)) or 0) >= maxF then
  return {4, count, queued, earliest, now}
end
local vt = tonumber(redis.call('HGET', V, 'V')) or 0
local tag = math.max(vt, tonumber(redis.call('HGET', V, 'f|' .. flow)) or 0)
redis.call('HSET', V, 'f|' .. flow, string.format('%.6f', tag + 1 / tonumber(ARGV[8])))
local seq = redis.call('HINCRBY', V, 'seq', 1)
local m = string.format('%d|%020.6f|%012d|%s|%s', tonumber(ARGV[6]), tag, seq, ARGV[9], ticket)
redis.call('ZADD', Q, 0, m)
redis.call('HSET', T, ticket, m, 'f|' .. ticket, flow)
redis.call('HINCRBY', V, 'n|' .. flow, 1)
for _, k in ipairs({Q, T, V}) do cover(k, 3 * ttl) end
return {2, count, queued + 1, earliest, now}
`)

// queueLeaveScript takes a ticket out: its place in the queue, or the
// lease it was granted and has not claimed (or holds: the caller knows
// which it is), and serves the queue.
//
//	KEYS: as queueAdmitScript
//	ARGV: ticket, limit, claim ms, channel prefix
//
// It returns 1 if it removed a lease, else 0.
var queueLeaveScript = redis.NewScript(queueLua + `
local ticket, limit, claim = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local m = redis.call('HGET', T, ticket)
if m then
  unqueue(Q, T, V, m, ticket)
  if redis.call('ZCARD', Q) == 0 then redis.call('DEL', V) end
  return 0
end
local removed = redis.call('ZREM', K, ticket)
serve(K, Q, T, V, P, limit, claim, now_ms(), ARGV[4])
return removed
`)

// queueAliveScript renews a process's liveness deadline: now plus ttl ms.
//
//	KEYS: the name's #procs
//	ARGV: process, ttl ms
var queueAliveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
return now
`)

// queueKeys are the keys of one capped key's queue.
type queueKeys struct {
	key, procs string
	wake       string // the prefix of the processes' channels
}

func (q queueKeys) list() []string {
	return []string{q.key, q.key + "#q", q.key + "#t", q.key + "#v", q.procs}
}

// ticket is a waiter as the queue sees it.
type ticket struct {
	id      string // its lease id
	proc    string // its process
	rank    uint8  // its priority class's rank: lower goes first
	flow    string
	weight  float64 // its flow's weight, > 0
	wait    bool    // queue it if the key is full
	maxQ    int     // the queue's bound (0: none)
	maxFlow int     // its flow's bound in the queue (0: none)
}

// queueReply is what the admit script found.
type queueReply struct {
	status   int
	count    int   // the key's leases
	queued   int   // the queue's length
	earliest int64 // the key's earliest lease expiry, server ms (0: none)
	now      int64 // server ms
}

var (
	errQueueReply  = errors.New("fleet: unexpected queue script reply")
	errQueueWeight = errors.New("fleet: a flow's weight must be a positive number")
)

// queueAdmit runs queueAdmitScript for t on q's key under limit, with
// leases of ttl ms granted for claim ms.
func queueAdmit(ctx context.Context, rdb redis.Scripter, q queueKeys, t ticket, ttl, claim int64, limit int) (queueReply, error) {
	if !(t.weight > 0) || math.IsInf(t.weight, 1) {
		return queueReply{}, fmt.Errorf("%w: %v", errQueueWeight, t.weight)
	}
	wait := 0
	if t.wait {
		wait = 1
	}
	res, err := queueAdmitScript.Run(ctx, rdb, q.list(), t.id, ttl, limit, claim, wait, t.rank, t.flow, t.weight, t.proc, q.wake, t.maxQ, t.maxFlow).Int64Slice()
	if err != nil {
		return queueReply{}, err
	}
	if len(res) != 5 {
		return queueReply{}, fmt.Errorf("%w: %v", errQueueReply, res)
	}
	return queueReply{status: int(res[0]), count: int(res[1]), queued: int(res[2]), earliest: res[3], now: res[4]}, nil
}

// queueLeave runs queueLeaveScript for ticket id, and reports whether it
// removed a lease.
func queueLeave(ctx context.Context, rdb redis.Scripter, q queueKeys, id string, claim int64, limit int) (bool, error) {
	n, err := queueLeaveScript.Run(ctx, rdb, q.list(), id, limit, claim, q.wake).Int64()
	return n == 1, err
}

// queueAlive renews proc's liveness deadline to ttl ms from now.
func queueAlive(ctx context.Context, rdb redis.Scripter, q queueKeys, proc string, ttl int64) error {
	return queueAliveScript.Run(ctx, rdb, []string{q.procs}, proc, ttl).Err()
}
