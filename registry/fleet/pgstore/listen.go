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
func (s *Store) Listen(ctx context.Context, proc string, l driver.Listener) {
	failing := false
	for ctx.Err() == nil {
		conn, learned, err := s.listenOn(ctx, proc)
		switch {
		case err == nil:
			if failing {
				failing = false
				s.log().Info("pgstore: listening again", slog.String("fleet", s.name))
			}
			s.receive(ctx, conn, learned, l)
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
func (s *Store) receive(ctx context.Context, conn *pgx.Conn, learned string, l driver.Listener) {
	defer conn.Close(context.Background())
	l.Listening()
	for {
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
				continue
			}
		}
		if err != nil {
			return
		}
		if strings.EqualFold(n.Channel, learned) {
			l.Learned(n.Payload)
		} else {
			l.Granted(n.Payload)
		}
	}
}

// listenOn connects and listens on proc's channel and the learned
// states', within the time a check waits for an answer: a peer that takes
// the connection and says nothing does not hold Listen. The channels'
// names are asked of the pool, whose connections find the schema (a
// listen config's may have another search_path).
func (s *Store) listenOn(ctx context.Context, proc string) (conn *pgx.Conn, learned string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.answer())
	defer cancel()
	var wake string
	err = s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_channel($1, $2), inflight_channel($1, '#learned')`, s.name, proc).Scan(&wake, &learned)
	})
	if err != nil {
		return nil, "", fmt.Errorf("pgstore: channel names: %w", err)
	}
	conn, err = s.connect(ctx)
	if err != nil {
		return nil, "", err
	}
	for _, ch := range []string{wake, learned} {
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		}
	}
	if err != nil {
		conn.Close(context.Background())
		return nil, "", err
	}
	return conn, learned, nil
}

// connect makes Listen's connection: with the listen config if there is
// one, else as the pool makes its connections, through its hooks (a
// BeforeConnect may set the password, a token made for each connection; an
// AfterConnect the search_path).
func (s *Store) connect(ctx context.Context) (*pgx.Conn, error) {
	if s.listen != nil {
		return pgx.ConnectConfig(ctx, s.listen)
	}
	pc := s.pool.Config()
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
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
