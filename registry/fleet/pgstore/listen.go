package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Listen listens on proc's channel and the learned states', on a
// connection of its own, until ctx ends; when the connection fails it
// connects again after the retry interval. The connection is made with
// the listen config (WithListenConfig) or else as the pool makes its own,
// through its BeforeConnect and AfterConnect. A failure to listen is
// logged, once until Listen listens again: meanwhile the fleet's waiters
// learn of their grants only when they ask again.
//
// A connection may listen and still receive nothing: through a pooler in
// transaction mode (PgBouncer's), LISTEN holds only for the transaction
// that ran it, on whichever server connection ran it. So once it listens,
// and then at each check of a quiet connection (see WithListenCheck)
// unless a probe is awaited, Listen sends a probe to its own channel
// through the pool, as the fleet's grants are sent; the probe is dropped
// when it arrives, never delivered to l. A probe that has not arrived
// within the time a check waits for an answer is logged as a warning,
// once until a probe arrives again.
func (s *Store) Listen(ctx context.Context, proc string, l driver.Listener) {
	failing := false
	var pr probe
	for ctx.Err() == nil {
		conn, ch, err := s.listenOn(ctx, proc)
		switch {
		case err == nil:
			if failing {
				failing = false
				s.log().Info("pgstore: listening again", slog.String("fleet", s.name))
			}
			s.receive(ctx, conn, ch, l, &pr)
		case ctx.Err() == nil && !failing:
			failing = true
			s.log().Warn("pgstore: Listen failed; until it listens, waiters learn of their grants only when they ask again",
				slog.String("fleet", s.name), slog.Any("error", err))
		}
		t := time.NewTimer(s.retry)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// receive delivers what conn receives until it fails or ctx ends, and
// closes it.
func (s *Store) receive(ctx context.Context, conn *pgx.Conn, ch channels, l driver.Listener, pr *probe) {
	defer conn.Close(context.Background())
	l.Listening()
	s.sendProbe(ctx, ch.wake, pr)
	for {
		s.probeOverdue(pr)
		wctx, cancel := context.WithTimeout(ctx, s.check)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && pgconn.Timeout(err) {
			// Quiet for a while: does the connection still answer? (A wait
			// that times out leaves it usable, and a notification that came
			// meanwhile is delivered by the next wait.)
			pctx, cancel := context.WithTimeout(ctx, s.answer())
			err = conn.Ping(pctx)
			cancel()
			if err == nil {
				// And does what is sent to it reach it?
				if pr.sent.IsZero() {
					s.sendProbe(ctx, ch.wake, pr)
				}
				continue
			}
		}
		if err != nil {
			return
		}
		if n == nil { // none and no error: not from a connection made as connect makes it
			continue
		}
		switch {
		case strings.EqualFold(n.Channel, ch.learned):
			l.Learned(n.Payload)
		case n.Payload == probePayload:
			s.probeArrived(pr)
		default:
			l.Granted(n.Payload)
		}
	}
}

// probePayload is the payload of Listen's probe. A grant's is its ticket,
// 32 hex digits, so a probe is never taken for one.
const probePayload = "#probe"

// probe is what Listen knows of its probes (see Listen).
type probe struct {
	sent   time.Time // when the probe awaited was sent; zero: none is
	warned bool      // its not arriving was logged, and none has arrived since
}

// sendProbe sends a probe to channel through the pool, as the fleet's
// calls send grants, and awaits it (no other). One that cannot be sent
// (the pool's calls failing) is not awaited: it tells nothing of Listen's
// connection. Nor is one for which the pool has no connection within
// probeWait: Listen reads nothing while it sends, and a busy pool is when
// grants come (a review measured a grant 2.96 s late, waiting behind a
// probe); the next quiet check sends another.
func (s *Store) sendProbe(ctx context.Context, channel string, pr *probe) {
	pr.sent = time.Time{}
	actx, cancel := context.WithTimeout(ctx, min(probeWait, s.answer()))
	c, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		return
	}
	defer c.Release()
	ctx, cancel = context.WithTimeout(ctx, s.answer())
	defer cancel()
	if _, err := c.Exec(ctx, "SELECT pg_notify($1, $2)", channel, probePayload); err == nil {
		pr.sent = time.Now()
	}
}

// probeWait is how long a probe waits for a connection of the pool.
const probeWait = 100 * time.Millisecond

// probeOverdue logs, once until a probe arrives again, a probe awaited
// for longer than the time a check waits for an answer, and awaits it no
// more (the next quiet check sends another).
func (s *Store) probeOverdue(pr *probe) {
	if pr.sent.IsZero() || time.Since(pr.sent) < s.answer() {
		return
	}
	pr.sent = time.Time{}
	if pr.warned {
		return
	}
	pr.warned = true
	why := "is a pooler in transaction mode (PgBouncer's) between it and the database? LISTEN is session state: " +
		"give WithListenConfig a connection straight to the database"
	if s.listen != nil {
		why = "does the connection of WithListenConfig reach the database that the pool's calls run on, " +
			"straight and not through a pooler in transaction mode?"
	}
	s.log().Warn("pgstore: Listen's connection listens but receives nothing: a probe sent to it through the pool did not arrive; "+
		why+"; until it receives, waiters learn of their grants only when they ask again",
		slog.String("fleet", s.name), slog.Duration("waited", s.answer()))
}

// probeArrived takes note of a probe that arrived, and logs it if its not
// arriving was logged.
func (s *Store) probeArrived(pr *probe) {
	pr.sent = time.Time{}
	if pr.warned {
		pr.warned = false
		s.log().Info("pgstore: Listen's connection receives again", slog.String("fleet", s.name))
	}
}

// channels are the names of the channels Listen listens on.
type channels struct{ wake, learned string }

// listenOn connects and listens on proc's channel and the learned
// states', within the time a check waits for an answer: a peer that takes
// the connection and says nothing does not hold Listen. The channels'
// names are asked of the pool, whose connections find the schema (a
// listen config's may have another search_path).
func (s *Store) listenOn(ctx context.Context, proc string) (*pgx.Conn, channels, error) {
	ctx, cancel := context.WithTimeout(ctx, s.answer())
	defer cancel()
	var ch channels
	err := s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_channel($1, $2), inflight_channel($1, '#learned')`, s.name, proc).Scan(&ch.wake, &ch.learned)
	})
	if err != nil {
		return nil, channels{}, fmt.Errorf("pgstore: channel names: %w", err)
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, channels{}, err
	}
	for _, name := range []string{ch.wake, ch.learned} {
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{name}.Sanitize())
		}
	}
	if err != nil {
		conn.Close(context.Background())
		return nil, channels{}, err
	}
	return conn, ch, nil
}

// connect makes Listen's connection: with the listen config if there is
// one, else as the pool makes its connections, through its hooks (a
// BeforeConnect may set the password, a token made for each connection; an
// AfterConnect the search_path).
func (s *Store) connect(ctx context.Context) (*pgx.Conn, error) {
	if s.listen != nil {
		return pgx.ConnectConfig(ctx, ownNotifications(s.listen.Copy()))
	}
	pc := s.pool.Config() // a copy, with its ConnConfig's
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, ownNotifications(pc.ConnConfig))
	if err != nil {
		return nil, err
	}
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(ctx, conn); err != nil {
			conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

// answer is how long Listen waits for the server to answer: the check's
// interval, and at least a second, so that a busy server or process is
// not taken for a dead connection.
func (s *Store) answer() time.Duration { return max(s.check, time.Second) }

// ownNotifications takes out of cfg, a copy, the notification handler of
// the connections it was made for (an application that listens on its
// pool's): pgx hands each notification to such a handler instead of
// WaitForNotification, which would then deliver nothing to Listen. The
// notifications of Listen's connection are the fleet's.
func ownNotifications(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	cfg.OnNotification = nil
	return cfg
}
