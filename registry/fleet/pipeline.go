package fleet

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// maxPipeline bounds the acquire calls sent together; dispatchers is how
// many batches may be on their way at once (so that one slow batch does not
// hold up the calls behind it).
const (
	maxPipeline = 128
	dispatchers = 4
)

// scriptCall is one acquire script call, sent by the dispatcher.
type scriptCall struct {
	keys []string
	args []any
	res  []int64
	err  error
	done chan struct{} // closed once res and err are set
}

// dispatch sends the acquire calls of concurrent admissions together: each
// batch is one pipeline, one write and one read, gathered while earlier
// batches were on their way. A lone call goes at once. Several dispatchers
// run.
func (r *Registry[K]) dispatch() {
	defer r.done.Done()
	for {
		select {
		case c := <-r.calls:
			batch := []*scriptCall{c}
		gather:
			for len(batch) < maxPipeline {
				select {
				case c := <-r.calls:
					batch = append(batch, c)
				default:
					break gather
				}
			}
			r.send(batch)
		case <-r.stopping.Done():
			for { // never sent: they fail
				select {
				case c := <-r.calls:
					c.err = ErrClosed
					close(c.done)
				default:
					return
				}
			}
		}
	}
}

// send runs a batch of acquire calls as one pipeline, within the call
// timeout; a script the server does not have (NOSCRIPT, after a restart or
// SCRIPT FLUSH) is loaded and those calls sent again.
func (r *Registry[K]) send(batch []*scriptCall) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	cmds := r.pipeline(ctx, batch, false)
	var again []*scriptCall
	var againAt []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, batch[i])
			againAt = append(againAt, i)
		}
	}
	if len(again) > 0 {
		for j, cmd := range r.pipeline(ctx, again, true) {
			cmds[againAt[j]] = cmd
		}
	}
	for i, c := range batch {
		c.res, c.err = cmds[i].Int64Slice()
		close(c.done)
	}
}

// pipeline sends calls as EVALSHA, or with eval as EVAL (which loads the
// script), in one pipeline.
func (r *Registry[K]) pipeline(ctx context.Context, calls []*scriptCall, eval bool) []*redis.Cmd {
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		if eval {
			cmds[i] = acquireScript.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = acquireScript.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds
}

// call sends one acquire call through the dispatcher and waits for its
// reply, for ctx, or for Close. sent reports whether the call may have
// reached Redis (and so must be abandoned if it did not succeed).
func (r *Registry[K]) call(ctx context.Context, keys []string, args []any) (res []int64, err error, sent bool) {
	c := &scriptCall{keys: keys, args: args, done: make(chan struct{})}
	select {
	case r.calls <- c:
	case <-ctx.Done():
		return nil, ctx.Err(), false
	case <-r.stopping.Done():
		return nil, ErrClosed, false
	}
	select {
	case <-c.done:
		return c.res, c.err, true
	case <-ctx.Done():
		return nil, ctx.Err(), true
	case <-r.stopping.Done():
		return nil, ErrClosed, true
	}
}
