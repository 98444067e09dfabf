package pacing

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A naive model of the window: every charge with its step.
type naiveWin struct {
	limit int64
	ev    map[int64]int64
}

func (n *naiveWin) sumFrom(from, cur int64) (s int64) {
	for st, v := range n.ev {
		if st >= from && st <= cur {
			s += v
		}
	}
	return s
}

func (n *naiveWin) fitAt(c, now int64) int64 {
	cur := now / int64(budgetStep)
	tot := n.sumFrom(cur-budgetSteps, cur)
	if tot <= 0 || tot+c <= n.limit {
		return 0
	}
	for T := cur + 1; ; T++ {
		left := n.sumFrom(T-budgetSteps, cur)
		if left <= 0 || left+c <= n.limit {
			return T * int64(budgetStep)
		}
	}
}

// The window agrees with a naive record of every charge over random
// gaps (up to two hours), corrections in and out of the window, and a
// clock that starts near 0.
func TestWindowAgainstNaive(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		w := window{limit: 1000}
		n := naiveWin{limit: 1000, ev: map[int64]int64{}}
		now := int64(r.IntN(3)) * int64(time.Millisecond)
		type ch struct{ s, c int64 }
		var charges []ch
		for i := range 400 {
			switch r.IntN(10) {
			case 0:
				now += int64(time.Duration(r.IntN(7200)) * time.Second)
			case 1, 2:
				now += int64(time.Duration(r.IntN(70)) * time.Second)
			default:
				now += int64(time.Duration(r.IntN(3000)) * time.Millisecond)
			}
			c := int64(1 + r.IntN(600))
			a, b := w.fitAt(c, now), n.fitAt(c, now)
			if a != b {
				t.Fatalf("seed %d op %d: fitAt(%d, %d) = %d, naive %d", seed, i, c, now, a, b)
			}
			if a == 0 {
				w.charge(c, now)
				s := now / int64(budgetStep)
				n.ev[s] += c
				charges = append(charges, ch{s, c})
			}
			if len(charges) > 0 && r.IntN(3) == 0 {
				k := r.IntN(len(charges))
				x := charges[k]
				d := int64(r.IntN(int(2*x.c+1))) - x.c // [-c, c]
				w.correct(x.s, d, now)
				cur := now / int64(budgetStep)
				if x.s >= cur-budgetSteps {
					n.ev[x.s] += d
				} else if d > 0 {
					n.ev[cur] += d
				}
				charges[k].c += d
				if charges[k].c <= 0 {
					charges = append(charges[:k], charges[k+1:]...)
				}
			}
			cur := now / int64(budgetStep)
			if got, want := w.limit-w.left(now), n.sumFrom(cur-budgetSteps, cur); got != want {
				t.Fatalf("seed %d op %d: total %d, naive %d", seed, i, got, want)
			}
		}
	}
}
