package redisstore

import "github.com/redis/go-redis/v9"

// learnWriteScript writes a learned state if Redis still has the version
// the caller presumes, and publishes it, in one round trip; else it
// returns the state Redis has, for the caller to apply its evidence to and
// try again. A version is compared as the digits of the state's "v" (the
// first "v" key in it: a state's JSON begins {"k":<its key's name>,"v":,
// and a name's quotes are escaped), never as a Lua number, whose doubles
// would take two versions over 2^53 for one.
//
//	KEYS: the state's key
//	ARGV: the version presumed ('-': no state; '?': one without a
//	      version), the state to write ('': none, a read), the learned
//	      channel, the state's TTL in ms
//
// It returns {1} if it wrote, {1, the error} if it wrote and could not
// publish; else {0, the version Redis has (as ARGV[1] tells it), the state
// (none if missing)}, and keeps a state it read from expiring while it is
// in use. The state is set before it is published, so that no message
// tells a state Redis does not have (a SET refused for lack of memory);
// a state set and not published is written all the same (the others read
// it within learnRefresh): were it taken for a failed write, its evidence
// would be applied again on top of itself, and a refusal's time counted
// twice.
var learnWriteScript = redis.NewScript(`
local raw = redis.call('GET', KEYS[1])
local v = '-'
if raw then v = string.match(raw, '"v":(%d+)[,}]') or '?' end
local ttl = tonumber(ARGV[4])
if ARGV[2] ~= '' and v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  local ok = redis.pcall('PUBLISH', ARGV[3], ARGV[2])
  if type(ok) == 'table' and ok.err then return {1, ok.err} end
  return {1}
end
if not raw then return {0, v} end
if redis.call('PTTL', KEYS[1]) < ttl / 2 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {0, v, raw}
`)
