package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/redis/go-redis/v9"
)

// Store is a fleet's store on Redis (standalone, Sentinel or Cluster): each
// operation one Lua script (scripts.go, queue.go, units.go, learned.go),
// wake-ups and learned states on pub/sub. Every key of a fleet shares the
// hash tag {<name>}, so that a script's keys are in one slot of a Cluster.
type Store struct {
	rdb redis.UniversalClient
	// prefix is "<prefix>{<name>}:", the start of every capped key's name.
	prefix string
	// The fleet's own keys: see scripts.go and queue.go.
	epochKey, pauseKey, procsKey string
	heardKey                     string // the silence (silence.go)
	wakePrefix                   string // + a process: its grants' channel
	learnPrefix, learnChan       string // + a key: its learned state; the states' channel
	budgetPrefix                 string // + a key: its budget (budget.go)
	budgetCallPrefix             string // + a budget call's id: its reply (budget.go)
	// retry is how long Listen waits to subscribe again after a failure;
	// check, how long it waits on a quiet connection before it asks it
	// for an answer (WithListenCheck).
	retry, check time.Duration
	logger       *slog.Logger // nil: slog.Default()
}

var _ driver.Store = (*Store)(nil)

// New returns the store of the fleet named name on rdb (a standalone,
// Sentinel or Cluster client): every process of a fleet uses the same
// name, and fleets of other names share rdb without meeting. Its keys are
// <prefix>{<name>}:<key> (a key with a '#', or that starts "abandoned:",
// marked: see key), and the fleet's own <prefix>{<name>}#...: one
// hash tag, so that each script's keys are in one slot of a Cluster. It
// panics if rdb is nil, or if name is empty or has a brace.
//
// Give rdb short timeouts (see the package documentation): a script that
// waits on a hung server holds the request that called it.
func New(rdb redis.UniversalClient, name string, opts ...Option) *Store {
	if rdb == nil {
		panic("redisstore: nil redis client")
	}
	if name == "" || strings.ContainsAny(name, "{}") {
		panic(fmt.Sprintf("redisstore: fleet name %q: need a non-empty name without braces", name))
	}
	cfg := config{prefix: "inflight:", retry: 500 * time.Millisecond, check: 15 * time.Second}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(&cfg)
	}
	tag := cfg.prefix + "{" + name + "}"
	return &Store{
		rdb:         rdb,
		retry:       cfg.retry,
		check:       cfg.check,
		logger:      cfg.logger,
		prefix:      tag + ":",
		epochKey:    tag + "#epoch",
		pauseKey:    tag + "#pause",
		procsKey:    tag + "#procs",
		heardKey:    tag + "#heard",
		wakePrefix:  tag + "#wake:",
		learnPrefix: tag + "#learn:",
		learnChan:   tag + "#learned",

		budgetPrefix:     tag + "#budget:",
		budgetCallPrefix: tag + "#budgetcall:",
	}
}

// Option configures a Store; a nil one is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	prefix       string
	retry, check time.Duration
	logger       *slog.Logger
}

// WithPrefix sets the start of every key's name (default "inflight:"). It
// panics if p has a brace: the keys' hash tag would change.
func WithPrefix(p string) Option {
	if strings.ContainsAny(p, "{}") {
		panic(fmt.Sprintf("redisstore: prefix %q: braces would change the keys' hash tag", p))
	}
	return optionFunc(func(c *config) { c.prefix = p })
}

// WithListenRetry sets how long Listen waits before it subscribes again
// after Redis could not be reached (default 500 ms; the fleet's WithPoll
// no longer sets it). It panics unless d > 0.
func WithListenRetry(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("redisstore: WithListenRetry(%v)", d))
	}
	return optionFunc(func(c *config) { c.retry = d })
}

// WithListenCheck sets how long Listen's connection may be quiet before
// Listen asks it for an answer (a PING; default 15 s). A connection lost
// without a word (a peer's host gone, a firewall or a load balancer that
// drops an idle connection's packets) stays open, and waiters would learn
// of their grants only when they ask again: one that does not answer
// within the same time (at least a second) is given up, and Listen
// subscribes anew on a connection of its own. It panics unless d > 0.
func WithListenCheck(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("redisstore: WithListenCheck(%v)", d))
	}
	return optionFunc(func(c *config) { c.check = d })
}

// WithLogger sets the logger (nil, the default: slog.Default()) of what the
// store finds on its own: a server that may evict the fleet's keys, and
// Listen's connection given up or refused.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

func (s *Store) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

// checkEviction logs a warning when the server may evict the fleet's keys:
// it has a memory limit and a maxmemory-policy other than noeviction. A
// key's leases are kept with an expiry (that of the latest), so that every
// volatile-* policy may evict them, and allkeys-* too; their epoch is not
// lost with them, so the holders' leases count as expired, and go back
// only where another process has not taken their place (see the fleet's
// PROTOCOL.md). Asked of the server the client reaches, or of each master
// of a Cluster.
func (s *Store) checkEviction(ctx context.Context) {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			s.checkEvictionOf(ctx, c)
			return nil
		})
		return
	}
	s.checkEvictionOf(ctx, s.rdb)
}

// checkEvictionOf is checkEviction of the server c reaches.
func (s *Store) checkEvictionOf(ctx context.Context, c redis.Cmdable) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return // told by the calls that fail
	}
	var limit, policy string
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			limit = v
		case "maxmemory_policy":
			policy = v
		}
	}
	if limit != "" && limit != "0" && policy != "" && policy != "noeviction" {
		s.log().Warn("redisstore: the server may evict the fleet's keys, and an evicted key's leases count as expired, "+
			"which others may take over their live holders: set maxmemory-policy noeviction",
			slog.String("fleet", s.prefix), slog.String("maxmemory_policy", policy), slog.String("maxmemory", limit))
	}
}

// String names the store in the fleet's logs: the start of its keys.
func (s *Store) String() string { return s.prefix }

// key is the Redis key of a capped key's leases: the fleet's prefix, then
// the key's name, kept apart from the names the scripts build from it
// (its name and a suffix after '#': its queue, its units...) and from the
// tombstones (abandoned: and a lease id). A name that has a '#' or starts
// as a tombstone is marked with a '#' before it, and each of its '#'s is
// doubled: every '#' of such a name is then in a run of even length but
// the first, and a suffix makes its name's last run odd. Other names are
// kept as they are, as the release before this one kept every name.
func (s *Store) key(name string) string {
	if !strings.Contains(name, "#") && !strings.HasPrefix(name, tombstones) {
		return s.prefix + name
	}
	return s.prefix + "#" + strings.ReplaceAll(name, "#", "##")
}

// flowName is flow as a key's queue counts it: a flow's count is its name
// after "n|", a class's flow's is the class, '|' and the name, so a name
// that has a '|' is marked with a '|' before it (a class is a digit).
// Other names are kept as they are, as the release before this one kept
// every name.
func flowName(flow string) string {
	if strings.Contains(flow, "|") {
		return "|" + flow
	}
	return flow
}

// tombstones starts the name of a lease id's tombstone, after the prefix.
const tombstones = "abandoned:"

// tombstone is the key that marks lease id abandoned.
func (s *Store) tombstone(id string) string { return s.prefix + tombstones + id }

// errReply is a reply not shaped as the script's.
var errReply = fmt.Errorf("%w (redis)", driver.ErrBadReply)

// AdmitOne runs the acquire script as EVALSHA (EVAL if the server lacks
// it).
func (s *Store) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	keys, args := s.admitArgs(c)
	res, err := acquireScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	r := decodeAdmit(c, res, err)
	return r, r.Err
}

// Admit runs the acquire script for each call in one pipeline.
func (s *Store) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	keys, args := make([][]string, len(calls)), make([][]any, len(calls))
	for i, c := range calls {
		keys[i], args[i] = s.admitArgs(c)
	}
	out := make([]driver.AdmitResult, len(calls))
	for i, cmd := range evalAll(ctx, s.rdb, acquireScript, keys, args) {
		res, err := cmd.Int64Slice()
		out[i] = decodeAdmit(calls[i], res, err)
	}
	return out, nil
}

// Pipelines reports that Admit is one round trip (driver.Pipeliner): the
// fleet sends claims of grants made together in one pipeline.
func (s *Store) Pipelines() bool { return true }

var _ driver.Pipeliner = (*Store)(nil)

// admitArgs returns the acquire script's keys and arguments for c.
func (s *Store) admitArgs(c *driver.AdmitCall) ([]string, []any) {
	keys := make([]string, 0, acquireKeys+len(c.Keys)+2*len(c.Carried)+1)
	args := make([]any, 0, acquireArgs+len(c.Keys)+2*len(c.Carried))
	keys = append(keys, s.epochKey, s.pauseKey, s.tombstone(c.Lease), s.procsKey)
	for _, k := range c.Keys {
		keys = append(keys, s.key(k))
	}
	wait := 0
	if c.Wait {
		wait = 1
	}
	if c.Starts {
		wait += 2
	}
	args = append(args, c.Lease, driver.Millis(c.TTL), len(c.Keys), c.NotAfter, c.Epoch, c.Pause.Milliseconds(), wait,
		driver.Millis(c.Claim), c.Class, flowName(c.Flow), c.Weight, c.Proc, s.wakePrefix, c.MaxQueue, c.MaxFlowQueue, c.LiveMillis(),
		max(c.Units, 1))
	for _, n := range c.Limits {
		args = append(args, n)
	}
	for _, p := range c.Carried {
		keys = append(keys, s.key(p.Key), s.tombstone(p.Lease))
		args = append(args, p.Lease, max(p.Units, 1))
	}
	return append(keys, s.heardKey), args
}

// replyLen is the length of the acquire script's reply, but for an
// admission's with starts, which has each key's units held after it.
const replyLen = 7

// decodeAdmit reads the acquire script's reply res to c.
func decodeAdmit(c *driver.AdmitCall, res []int64, err error) driver.AdmitResult {
	if err != nil {
		return driver.AdmitResult{Err: err}
	}
	if len(res) < replyLen {
		return driver.AdmitResult{Err: fmt.Errorf("%w: %v", errReply, res)}
	}
	r := driver.AdmitResult{Status: driver.Status(res[0]), Key: int(res[1]) - 1, Count: res[2], Earliest: res[3], Now: res[4], Epoch: res[5], Queue: res[6]}
	if r.Status == driver.StatusAdmitted && c.Starts {
		if len(res) != replyLen+len(c.Keys) {
			return driver.AdmitResult{Err: fmt.Errorf("%w: %v", errReply, res)}
		}
		r.Start, r.Earliest, r.Counts = res[3], 0, res[replyLen:]
	}
	return r
}

// Renew runs the renew script.
func (s *Store) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	keys := make([]string, 0, 3+2*len(c.Leases))
	args := make([]any, 0, 4+6*len(c.Leases))
	keys = append(keys, s.epochKey, s.pauseKey)
	args = append(args, driver.Millis(c.TTL), c.NotAfter, c.Epoch, c.Pause.Milliseconds())
	for _, x := range c.Leases {
		for _, k := range x.Keys {
			keys = append(keys, s.key(k))
		}
		keys = append(keys, s.tombstone(x.Lease))
		args = append(args, x.Lease, int(x.Mode), x.Epoch, len(x.Keys), max(x.Units, 1))
		for _, n := range x.Limits {
			args = append(args, n)
		}
	}
	res, err := renewScript.Run(ctx, s.rdb, append(keys, s.heardKey), args...).Int64Slice()
	switch {
	case err != nil:
		return driver.RenewResult{}, err
	case len(res) == 2 && res[0] == int64(driver.StatusTooLate):
		return driver.RenewResult{TooLate: true, Now: res[1]}, nil
	case len(res) != 2+len(c.Leases):
		return driver.RenewResult{}, fmt.Errorf("%w: %v", errReply, res)
	}
	out := driver.RenewResult{Epoch: res[0], Now: res[1], Leases: make([]driver.Fate, len(c.Leases))}
	for i, f := range res[2:] {
		out.Leases[i] = driver.Fate(f)
	}
	return out, nil
}

// Release runs the release script.
func (s *Store) Release(ctx context.Context, c *driver.ReleaseCall) error {
	keys := make([]string, 0, 3+len(c.Pairs))
	args := make([]any, 0, 3+2*len(c.Pairs))
	keys = append(keys, s.pauseKey, s.procsKey)
	args = append(args, driver.Millis(c.Claim), s.wakePrefix)
	for _, p := range c.Pairs {
		keys = append(keys, s.key(p.Key))
		args = append(args, p.Lease, p.Limit)
	}
	ttl := int64(0) // none: the call finds no silence
	if c.TTL > 0 {
		ttl = driver.Millis(c.TTL)
	}
	return releaseScript.Run(ctx, s.rdb, append(keys, s.heardKey), append(args, ttl, c.Pause.Milliseconds())...).Err()
}

// Abandon runs the abandon script for each call, in one pipeline.
func (s *Store) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	keys, args := make([][]string, len(calls)), make([][]any, len(calls))
	for i, c := range calls {
		keys[i] = make([]string, 0, 4+len(c.Keys))
		keys[i] = append(keys[i], s.pauseKey, s.procsKey)
		for _, k := range c.Keys {
			keys[i] = append(keys[i], s.key(k))
		}
		keys[i] = append(keys[i], s.tombstone(c.Lease), s.heardKey)
		args[i] = []any{c.Lease, driver.Millis(c.TTL), c.NotAfter, driver.Millis(c.Claim), s.wakePrefix, c.Pause.Milliseconds()}
		for _, n := range c.Limits {
			args[i] = append(args[i], n)
		}
	}
	errs := make([]error, len(calls))
	for i, cmd := range evalAll(ctx, s.rdb, abandonScript, keys, args) {
		errs[i] = cmd.Err()
	}
	return errs, nil
}

// Leave deletes proc from the liveness hash.
func (s *Store) Leave(ctx context.Context, proc string) error {
	return s.rdb.HDel(ctx, s.procsKey, proc).Err()
}

// Ping pings Redis.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// Count returns the units of the key's leases that expire after the
// server's time now (countScript).
func (s *Store) Count(ctx context.Context, key string) (int, error) {
	n, err := countScript.Run(ctx, s.rdb, []string{s.key(key), s.heardKey}).Int()
	return n, err
}

// SyncLearned runs the learned state's script.
func (s *Store) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	res, err := learnWriteScript.Run(ctx, s.rdb, []string{s.learnPrefix + c.Key}, c.Presumed, c.State, s.learnChan, driver.Millis(c.TTL)).Slice()
	if err != nil {
		return driver.LearnedResult{}, err
	}
	if len(res) == 0 {
		return driver.LearnedResult{}, fmt.Errorf("%w: %v", errReply, res)
	}
	if n, _ := res[0].(int64); n == 1 {
		out := driver.LearnedResult{Wrote: true}
		if len(res) > 1 {
			out.PublishErr = fmt.Sprint(res[1])
		}
		return out, nil
	}
	var out driver.LearnedResult
	if len(res) >= 2 {
		out.Version, _ = res[1].(string)
	}
	if len(res) >= 3 {
		out.State, out.Found = res[2].(string)
	}
	return out, nil
}

// evalAll runs script once for each (keys[i], args[i]) in one pipeline, as
// EVALSHA, then sends again as EVAL (which loads the script) the calls the
// server had no script for (NOSCRIPT: after a restart or SCRIPT FLUSH). It
// returns each call's command, with its own reply or error.
func evalAll(ctx context.Context, rdb redis.UniversalClient, script *redis.Script, keys [][]string, args [][]any) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(keys))
	pipe := rdb.Pipeline()
	for i := range keys {
		cmds[i] = script.EvalSha(ctx, pipe, keys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx) // the first error; each command has its own
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return cmds
	}
	pipe = rdb.Pipeline()
	for _, i := range again {
		cmds[i] = script.Eval(ctx, pipe, keys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx)
	return cmds
}
