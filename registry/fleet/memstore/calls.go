package memstore

import (
	"context"
	"slices"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// AdmitOne makes one admission call (see driver.AdmitCall for its steps).
func (s *Store) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if err := s.enter(ctx); err != nil {
		return driver.AdmitResult{Err: err}, err
	}
	defer s.mu.Unlock()
	return s.admit(c), nil
}

// Admit makes each call in order, each atomically.
func (s *Store) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	out := make([]driver.AdmitResult, len(calls))
	for i, c := range calls {
		out[i], _ = s.AdmitOne(ctx, c)
	}
	return out, nil
}

func (s *Store) admit(c *driver.AdmitCall) driver.AdmitResult {
	now, us := s.now()
	if c.NotAfter > 0 && now > c.NotAfter {
		return driver.AdmitResult{Status: driver.StatusTooLate, Key: -1, Now: now}
	}
	s.silence(now, c.TTL)
	s.swept(now)
	ttl, claim := driver.Millis(c.TTL), driver.Millis(c.Claim)
	epoch, paused := s.epochOf(now, us, c.Epoch, c.Pause, c.TTL)
	res := func(st driver.Status, i int) driver.AdmitResult {
		r := driver.AdmitResult{Status: st, Key: i, Now: now, Epoch: epoch}
		if i >= 0 {
			k := s.key(c.Keys[i])
			r.Count, r.Earliest, r.Queue = int64(k.count(now)), k.earliest(now), int64(len(k.queue))
		}
		return r
	}
	for _, p := range c.Carried {
		if !s.tombstoned(p.Lease, now) {
			k := s.key(p.Key)
			k.hold(p.Lease, max(k.leases[p.Lease], now+ttl))
			k.weigh(p.Lease, p.Units)
		}
	}
	if s.tombstoned(c.Lease, now) {
		return res(driver.StatusAbandoned, -1)
	}
	stopped := paused > now && binds(c.Limits)
	mine := s.queuedOn(c.Keys[0], c.Lease)
	if mine != nil {
		mine.limits = append(mine.limits[:0], c.Limits...)
	}
	kept := make([]bool, len(c.Keys))        // serving stopped at a heavy waiter
	blockers := make([]*ticket, len(c.Keys)) // the heavy waiter it went past
	serve := func() {
		if !stopped {
			for i, name := range c.Keys {
				kept[i], blockers[i] = s.serve(name, c.Limits[i], now, claim)
			}
		}
	}
	serve()
	held, over := 0, false
	for i, name := range c.Keys {
		k := s.key(name)
		k.dropExpired(now)
		if _, ok := k.leases[c.Lease]; ok {
			held++
		}
		over = over || k.count(now) > c.Limits[i]
	}
	givenBack := false
	switch {
	case held == len(c.Keys) && !over: // a grant claimed, or a call made again
		for _, name := range c.Keys {
			s.key(name).hold(c.Lease, now+ttl)
		}
		return s.admitted(c, res, us)
	case held > 0: // a grant made under a higher limit, or a part of one
		givenBack = held == len(c.Keys)
		for _, name := range c.Keys {
			s.key(name).drop(c.Lease)
		}
		serve()
	}
	if mine = s.queuedOn(c.Keys[0], c.Lease); mine != nil { // also while paused: its place outlasts the pause
		s.alive(c.Proc, now, c.LiveMillis())
		mine.expires = now + 3*ttl
	}
	if stopped {
		r := res(driver.StatusPaused, 0)
		r.Key, r.Earliest, r.Queue = -1, paused, 0
		return r
	}
	if mine != nil {
		return res(driver.StatusQueued, s.firstFull(c, kept, now, 0))
	}
	// A newcomer passes a heavy waiter as a waiter would: one of one key
	// that waits, counted against it; others are kept out.
	for i, b := range blockers {
		if b != nil && (len(c.Keys) > 1 || !c.Wait) {
			kept[i] = true
		}
	}
	full := s.firstFull(c, kept, now, -1)
	if full < 0 {
		for _, name := range c.Keys {
			k := s.key(name)
			k.hold(c.Lease, now+ttl)
			k.weigh(c.Lease, c.Units)
		}
		blockers[0].pass(c.Flow, c.Class, max(c.Units, 1))
		return s.admitted(c, res, us)
	}
	if !c.Wait {
		return res(driver.StatusFull, full)
	}
	if !givenBack {
		for i, name := range c.Keys {
			k := s.key(name)
			if c.MaxQueue >= 0 && len(k.queue) >= c.MaxQueue {
				return res(driver.StatusQueueMax, i)
			}
			if c.MaxFlowQueue >= 0 && k.flows[c.Flow] >= c.MaxFlowQueue {
				r := res(driver.StatusFlowMax, i)
				r.Queue = int64(k.flows[c.Flow])
				return r
			}
		}
	}
	t := &ticket{id: c.Lease, proc: c.Proc, flow: c.Flow, rank: c.Class, units: max(c.Units, 1), keys: slices.Clone(c.Keys), limits: slices.Clone(c.Limits), expires: now + 3*ttl}
	s.enqueue(t, c.Weight)
	s.alive(c.Proc, now, c.LiveMillis())
	return res(driver.StatusQueued, full)
}

// firstFull returns the index of c's first key without room for its
// units, or kept for a heavy waiter (or, if none, otherwise).
func (s *Store) firstFull(c *driver.AdmitCall, kept []bool, now int64, otherwise int) int {
	for i, name := range c.Keys {
		if kept[i] || s.key(name).count(now)+max(c.Units, 1) > c.Limits[i] {
			return i
		}
	}
	return otherwise
}

// admitted is the reply to an admission: with Starts, its start (the
// clock in microseconds) and each key's leases held, this one counted
// (see key.started).
func (s *Store) admitted(c *driver.AdmitCall, res func(driver.Status, int) driver.AdmitResult, us int64) driver.AdmitResult {
	r := res(driver.StatusAdmitted, -1)
	if c.Starts {
		r.Start = us
		r.Counts = make([]int64, len(c.Keys))
		for i, name := range c.Keys {
			r.Counts[i] = int64(s.key(name).started(r.Now))
		}
	}
	return r
}

// Renew extends, puts back or reports each lease (see driver.RenewCall).
func (s *Store) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	if err := s.enter(ctx); err != nil {
		return driver.RenewResult{}, err
	}
	defer s.mu.Unlock()
	now, us := s.now()
	if c.NotAfter > 0 && now > c.NotAfter {
		return driver.RenewResult{TooLate: true, Now: now}, nil
	}
	s.silence(now, c.TTL)
	ttl := driver.Millis(c.TTL)
	epoch, paused := s.epochOf(now, us, c.Epoch, c.Pause, c.TTL)
	out := driver.RenewResult{Epoch: epoch, Now: now, Leases: make([]driver.Fate, len(c.Leases))}
	for j, l := range c.Leases {
		var missing []int
		for i, name := range l.Keys {
			k := s.key(name)
			if exp, ok := k.leases[l.Lease]; ok && exp > now {
				k.hold(l.Lease, now+ttl)
				continue
			}
			k.drop(l.Lease)
			missing = append(missing, i)
		}
		if len(missing) == 0 {
			out.Leases[j] = driver.FateRenewed
			continue
		}
		out.Leases[j] = driver.FateGone
		if l.Mode == driver.ModeReport || s.tombstoned(l.Lease, now) {
			continue
		}
		checked := l.Mode == driver.ModeReassert && (l.Epoch == 0 || l.Epoch == epoch)
		room := !(checked && paused > now && binds(l.Limits))
		for _, i := range missing {
			if checked && room && s.key(l.Keys[i]).count(now)+max(l.Units, 1) > l.Limits[i] {
				room = false
			}
		}
		if !room {
			continue
		}
		for _, i := range missing {
			k := s.key(l.Keys[i])
			k.hold(l.Lease, now+ttl)
			k.weigh(l.Lease, l.Units)
		}
		out.Leases[j] = driver.FatePutBack
		if checked {
			out.Leases[j] = driver.FateRoom
		}
	}
	return out, nil
}

// Release removes each lease, then, unless a pause is declared, serves
// each key's queue once, in the order the keys first come, under the
// lowest limit the call gives it (serving here has no bound on the
// waiters it looks at).
func (s *Store) Release(ctx context.Context, c *driver.ReleaseCall) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now, _ := s.now()
	s.silence(now, c.TTL)
	var order []string
	limits := make(map[string]int, len(c.Pairs))
	for _, p := range c.Pairs {
		s.key(p.Key).drop(p.Lease)
		l, seen := limits[p.Key]
		if !seen {
			order = append(order, p.Key)
			l = p.Limit
		}
		limits[p.Key] = min(l, p.Limit)
	}
	for _, k := range order {
		if !s.declared(now) {
			s.serve(k, limits[k], now, driver.Millis(c.Claim))
		}
		s.tidy(k)
	}
	return nil
}

// Abandon takes each lease out of its keys' queues and leases, and marks
// it abandoned (see driver.AbandonCall).
func (s *Store) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now, _ := s.now()
	for _, c := range calls {
		s.silence(now, c.TTL)
		for _, name := range c.Keys {
			if t := s.queuedOn(name, c.Lease); t != nil {
				s.unqueue(t, true)
			}
			s.key(name).drop(c.Lease)
		}
		s.data.tombs[c.Lease] = max(now+driver.Millis(c.TTL), c.NotAfter+1)
		if c.Limits != nil && !s.declared(now) {
			for i, name := range c.Keys {
				s.serve(name, c.Limits[i], now, driver.Millis(c.Claim))
			}
		}
		for _, name := range c.Keys {
			s.tidy(name)
		}
	}
	return make([]error, len(calls)), nil
}

// tidy forgets name once nothing is held or queued on it.
func (s *Store) tidy(name string) {
	if k := s.data.keys[name]; k != nil && len(k.leases) == 0 && len(k.queue) == 0 {
		delete(s.data.keys, name)
	}
}
