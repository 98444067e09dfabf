package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A model check of this process's waiter list (enqueue, mayTry, blockedOn,
// wokenBy, dequeue), as used while waiters cannot be queued in Redis,
// with no timers: a waiter left asleep while it could go is a wake-up lost
// until its next poll. Caps are simulated; a release of a full key
// delivers its wake-up later, interleaved with everything else.
func TestWaitersModel(t *testing.T) {
	for seed := range uint64(100) {
		if msg := simWaiters(seed, 400); msg != "" {
			t.Fatalf("seed %d: %s", seed, msg)
		}
	}
}

type simW struct {
	w     *waiter
	state int // 0 check, 1 asleep, 2 trying
}

func simWaiters(seed uint64, steps int) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	keys := []string{"a", "b", "c"}
	capOf := map[string]int{"a": 1 + rng.IntN(2), "b": 1 + rng.IntN(2), "c": 1}
	held := map[string]int{}
	var holders [][]string
	var pubs []string
	var ws []*simW
	var log []string
	r := &Registry[string]{}
	room := func(k string) bool { return held[k] < capOf[k] }
	fail := func(f string, a ...any) string {
		var b strings.Builder
		for _, w := range r.allWaiters() {
			fmt.Fprintf(&b, " [rank %d keys %v blocked %v wake %d]", w.rank, w.keys, w.blocked, len(w.wake))
		}
		return fmt.Sprintf(f, a...) + "\nwaiters:" + b.String() + "\nheld: " + fmt.Sprint(held) + "\nlog:\n" + strings.Join(log, "\n")
	}
	remove := func(s *simW) { ws = slices.DeleteFunc(ws, func(v *simW) bool { return v == s }) }
	// one step of some waiter or of pub/sub; false if none can move
	move := func() bool {
		var can []func()
		for _, s := range ws {
			switch {
			case s.state == 0:
				can = append(can, func() {
					if ok, _ := r.mayTry(s.w); ok {
						s.state = 2
						log = append(log, fmt.Sprintf("%v may try", s.w.keys))
					} else {
						s.state = 1
						log = append(log, fmt.Sprintf("%v held back, blocked %v", s.w.keys, s.w.blocked))
					}
				})
			case s.state == 1 && len(s.w.wake) == 1:
				can = append(can, func() { <-s.w.wake; s.state = 0 })
			case s.state == 2:
				can = append(can, func() {
					for i, k := range s.w.keys {
						if !room(k) {
							r.blockedOn(s.w, k, true)
							s.state = 1
							log = append(log, fmt.Sprintf("%v full on %s (index %d)", s.w.keys, k, i))
							return
						}
					}
					for _, k := range s.w.keys {
						held[k]++
					}
					holders = append(holders, s.w.keys)
					r.dequeue(s.w)
					remove(s)
					log = append(log, fmt.Sprintf("%v admitted", s.w.keys))
				})
			}
		}
		if len(pubs) > 0 {
			can = append(can, func() {
				k := pubs[0]
				pubs = pubs[1:]
				r.wokenBy(k)
				log = append(log, "wokenBy "+k)
			})
		}
		if len(can) == 0 {
			return false
		}
		can[rng.IntN(len(can))]()
		return true
	}
	for range steps {
		switch n := rng.IntN(10); {
		case n < 3: // a new waiter
			var ks []string
			for _, k := range keys {
				if rng.IntN(2) == 0 {
					ks = append(ks, k)
				}
			}
			if len(ks) == 0 {
				ks = []string{keys[rng.IntN(3)]}
			}
			rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
			w := &waiter{rank: uint8(rng.IntN(3)), keys: ks, wake: make(chan struct{}, 1)}
			if err := r.enqueue(w); err != nil {
				return err.Error()
			}
			ws = append(ws, &simW{w: w})
			log = append(log, fmt.Sprintf("enqueue rank %d %v", w.rank, ks))
		case n < 5 && len(holders) > 0: // a release
			i := rng.IntN(len(holders))
			for _, k := range holders[i] {
				if held[k] >= capOf[k] {
					pubs = append(pubs, k)
				}
				held[k]--
			}
			log = append(log, fmt.Sprintf("release %v", holders[i]))
			holders = slices.Delete(holders, i, i+1)
		case n == 5 && len(ws) > 0 && rng.IntN(4) == 0: // a context ends
			s := ws[rng.IntN(len(ws))]
			r.dequeue(s.w)
			remove(s)
			log = append(log, fmt.Sprintf("cancel %v", s.w.keys))
		case n < 8:
			move()
		default: // quiescence: nobody may be left asleep who could go
			for move() {
			}
			unlined := 0
			for _, w := range r.allWaiters() {
				if w.inLine && !w.waiting {
					unlined++
				}
			}
			if unlined != r.waits.unlined {
				return fail("%d waiters in line without a place, counted %d", unlined, r.waits.unlined)
			}
			for _, w := range r.allWaiters() {
				for _, k := range w.blocked {
					if room(k) {
						return fail("asleep for good: %v blocks %s, which has room", w.keys, k)
					}
				}
				if !slices.ContainsFunc(w.keys, func(k string) bool { return !room(k) }) {
					return fail("asleep for good: %v, all its keys have room", w.keys)
				}
			}
		}
	}
	return ""
}

// allWaiters returns r's waiters, each once, in no set order.
func (r *Registry[K]) allWaiters() []*waiter {
	var all []*waiter
	for _, q := range r.waits.queues {
		for _, w := range q {
			if !slices.Contains(all, w) {
				all = append(all, w)
			}
		}
	}
	return all
}
