package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// listenAgainGap is the least time between two subscriptions Listen makes
// at once after its connection broke.
const listenAgainGap = 100 * time.Millisecond

// Listen subscribes to proc's channel and the learned states' channel.
// After its connection breaks it subscribes again at once, then every
// s.retry while Redis cannot be reached; after one lost without a word
// (see WithListenCheck), on a connection of its own. Beside the
// subscription it warns if the server may evict the fleet's keys
// (checkEviction), and returns once the check is over too: the check's
// calls (every master's INFO on a Cluster) may take seconds, a client's
// timeouts, and meanwhile Listen tells l Listening and delivers the
// grants, whose claim windows are shorter.
func (s *Store) Listen(ctx context.Context, proc string, l driver.Listener) {
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		s.checkEviction(ctx)
	}()
	defer func() { <-checked }()
	for s.listenOn(ctx, proc, l) {
		s.log().Warn("redisstore: Listen's connection did not answer a PING; subscribing anew on another",
			slog.Duration("quiet", s.check), slog.Duration("waited", max(s.check, time.Second)))
	}
}

// listenOn subscribes on a connection of its own and delivers what it
// hears until ctx ends (false) or the connection is found lost without a
// word (true): quiet for s.check, then without an answer to a PING for as
// long (at least a second).
func (s *Store) listenOn(ctx context.Context, proc string, l driver.Listener) (lost bool) {
	wake := s.wakePrefix + proc
	ps := s.rdb.Subscribe(ctx, wake, s.learnChan)
	// Receive does not end with its context: closing ps ends it.
	stop := context.AfterFunc(ctx, func() { ps.Close() })
	defer stop()
	defer ps.Close()
	failed := false     // the last Receive failed
	pinged := false     // asked for an answer since the last message
	refused := false    // the server refused the subscription, and it was logged
	var again time.Time // when Listen subscribed again after its last break
	for {
		start, read := time.Now(), s.check
		if pinged {
			read = max(read, time.Second) // the PING's answer: not given up on a brief stall
		}
		msg, err := ps.ReceiveTimeout(ctx, read)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			// Quiet: a read that timed out, unless it may have been the dial
			// (or the handshake) of a connection that broke, which fails
			// sooner as a rule (DialTimeout, ReadTimeout). A connection
			// dialled again after a break and lost before it answered
			// anything must be checked too: so must one kept after an
			// answer that was an error.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && (!failed || time.Since(start) >= s.check) {
				// Does the connection still answer? (A read that times out
				// leaves it usable; a PING that cannot be written breaks it,
				// and the next Receive dials again.)
				if pinged {
					return true
				}
				if err = ps.Ping(ctx); err == nil {
					pinged = true
					continue
				}
			}
			pinged = false
			// An error reply to a SUBSCRIBE (BUSY while a script runs,
			// NOPERM) leaves the connection usable and subscribed to nothing:
			// it subscribes again after the wait. (An error reply to a PING
			// leaves the subscription, which another SUBSCRIBE confirms.)
			var re redis.Error
			resubscribe := errors.As(err, &re)
			if resubscribe && !refused {
				refused = true
				s.log().Warn("redisstore: Redis refused a command of Listen's; it subscribes again, and until it does, "+
					"waiters learn of their grants only when they ask again", slog.Any("error", err))
			}
			// The client dials again on the next call: at once after a
			// connection that broke (killed, or a failover), but not more
			// often than listenAgainGap (a connection that breaks as it
			// subscribes), then every s.retry while Redis cannot be reached.
			wait := s.retry
			if !failed {
				wait = max(min(listenAgainGap-time.Since(again), s.retry), 0)
				again = time.Now().Add(wait)
			}
			failed = true
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return false
				case <-t.C:
				}
			}
			if resubscribe {
				_ = ps.Subscribe(ctx, wake, s.learnChan) // a failure: told by the next Receive
			}
			continue
		}
		failed, pinged = false, false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Channel == wake {
				refused = false
				l.Listening()
			}
		case *redis.Message:
			if m.Channel == s.learnChan {
				l.Learned(m.Payload)
			} else {
				l.Granted(m.Payload)
			}
		}
	}
}
