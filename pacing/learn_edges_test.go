package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// TestLoweredCapBindsAProbeBatch: a configured cap lowered while a batch of
// probes is out binds at once; the batch's top does not keep more starts
// going than the new cap.
func TestLoweredCapBindsAProbeBatch(t *testing.T) {
	for name, cfg := range map[string]func(n int) pacing.Config{
		"provider": func(n int) pacing.Config {
			return pacing.Config{MaxConcurrentRequests: n, Adaptive: &pacing.AdaptiveConfig{Initial: 2}}
		},
		"model": func(n int) pacing.Config {
			return pacing.Config{Models: map[string]pacing.ModelConfig{
				"m": {MaxConcurrentRequests: n, Adaptive: &pacing.AdaptiveConfig{Initial: 2}}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, cfg(20))
				held := acquireN(t, g, 3)
				g.Report(held[2], admitted) // the first probe proved 3: a batch of 2 may go
				held = append(held, acquireN(t, g, 2)...)
				require.NoError(t, g.Reconfigure(cfg(2)))
				for _, h := range held {
					h.Slot.Release()
				}
				var got []pacing.Grant
				for range 5 {
					c := acquireAsync(context.Background(), g, "m")
					synctest.Wait()
					if len(c) == 0 {
						g.Close()
						require.ErrorIs(t, (<-c).err, pacing.ErrGateClosed)
						break
					}
					r := <-c
					require.NoError(t, r.err)
					got = append(got, r.g)
				}
				assert.Len(t, got, 2, "in flight under the lowered cap of 2")
				for _, h := range got {
					h.Slot.Release()
				}
				g.Close()
			})
		})
	}
}

// TestReportAfterCloseChangesNothing: a closed Gate learns nothing more and
// arms no timer.
func TestReportAfterCloseChangesNothing(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 1000}})
		held := acquireN(t, g, 5)
		g.Close()
		g.Report(held[4], refused)
		before := g.Learned()
		time.Sleep(2 * time.Second) // past the retest a report could have armed
		assert.Equal(t, before.Limit, g.Learned().Limit)
		assert.Equal(t, before.Cap, g.Learned().Cap)
		for _, h := range held {
			h.Slot.Release()
		}
	})
}

// TestRateOfADroppedKeyPausesNothingElse: a rate answer for a key that has
// left the pool pauses neither the provider nor the other keys.
func TestRateOfADroppedKeyPausesNothingElse(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "a"}, {ID: "b"}}})
		gt := acquireN(t, g, 1)[0]
		require.Equal(t, "a", gt.Key)
		require.NoError(t, g.Reconfigure(pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "b"}}}))
		g.Report(gt, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 5 * time.Second})
		next := acquireN(t, g, 1)[0] // at once, on key b
		assert.Equal(t, "b", next.Key)
		next.Slot.Release()
		gt.Slot.Release()
		g.Close()
	})
}

// TestQuotaOfAHugeRetryAfterKeepsTheKeyOut: a verdict from a classifier of
// one's own with a RetryAfter near the largest duration keeps the key out
// (for a day at most), instead of overflowing the clock.
func TestQuotaOfAHugeRetryAfterKeepsTheKeyOut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "a"}}})
		time.Sleep(time.Second)
		gt := acquireN(t, g, 1)[0]
		g.Report(gt, pacing.Verdict{Kind: pacing.Quota, RetryAfter: math.MaxInt64})
		gt.Slot.Release()
		c := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		assert.Empty(t, c, "the only key is out of quota")
		g.Close()
		<-c
	})
}

// TestRetryAfterIsNeverNegative: huge, infinite and malformed Retry-After
// values are at most a day and never negative.
func TestRetryAfterIsNeverNegative(t *testing.T) {
	for _, hv := range [][2]string{
		{"Retry-After", "10000000000"}, {"Retry-After", "1e300"}, {"Retry-After", "NaN"},
		{"Retry-After", "Inf"}, {"Retry-After", "-5"}, {"Retry-After-Ms", "1e300"}, {"Retry-After-Ms", "NaN"},
	} {
		h := http.Header{}
		h.Set(hv[0], hv[1])
		v := pacing.DefaultClassifier(http.StatusTooManyRequests, h, []byte(`{"error":{"code":"insufficient_quota"}}`))
		assert.GreaterOrEqual(t, v.RetryAfter, time.Duration(0), "%s: %s", hv[0], hv[1])
		assert.LessOrEqual(t, v.RetryAfter, 24*time.Hour, "%s: %s", hv[0], hv[1])
	}
}

// TestClassifyNilResponse: no response is no evidence, not a panic.
func TestClassifyNilResponse(t *testing.T) {
	assert.Equal(t, pacing.Other, pacing.Classify(nil, nil).Kind)
}

// TestOverloadCutsOncePerBurst: the answers of one overload burst, and a
// grant reported twice, lower the learned cap once.
func TestOverloadCutsOncePerBurst(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 20, Max: 40}})
		held := acquireN(t, g, 10)
		overload := pacing.Verdict{Kind: pacing.Overload}
		before := g.Learned().Cap
		g.Report(held[0], overload)
		once := g.Learned().Cap
		assert.Less(t, once, before, "an overload lowers the cap")
		g.Report(held[0], overload) // the same grant again
		for _, h := range held[1:] {
			g.Report(h, overload) // the rest of the burst
		}
		assert.Equal(t, once, g.Learned().Cap, "one burst, one cut")
		for _, h := range held {
			h.Slot.Release()
		}
		g.Close()
	})
}

// TestForeignGrantIsNoEvidence: a grant of another Gate moves nothing here.
func TestForeignGrantIsNoEvidence(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		a := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2}})
		b := newGate(t, pacing.Config{})
		held := acquireN(t, b, 50)
		before := a.Learned()
		a.Report(held[49], admitted)
		assert.Equal(t, before.Cap, a.Learned().Cap)
		assert.Equal(t, before.Limit, a.Learned().Limit)
		for _, h := range held {
			h.Slot.Release()
		}
		a.Close()
		b.Close()
	})
}

// onceFailing is a body that fails once after its data, then ends.
type onceFailing struct {
	data   []byte
	failed bool
}

var errCutMidway = errors.New("connection reset midway")

func (b *onceFailing) Read(p []byte) (int, error) {
	if len(b.data) > 0 {
		n := copy(p, b.data)
		b.data = b.data[n:]
		return n, nil
	}
	if !b.failed {
		b.failed = true
		return 0, errCutMidway
	}
	return 0, io.EOF
}

func (b *onceFailing) Close() error { return nil }

// TestClassifyKeepsABodysError: a body that fails within the prefix
// Classify reads gives its reader the bytes and then the error, not a
// clean end, even if it does not repeat the error itself.
func TestClassifyKeepsABodysError(t *testing.T) {
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{},
		Body: &onceFailing{data: []byte(strings.Repeat("x", 100))}}
	pacing.Classify(resp, nil)
	got, err := io.ReadAll(resp.Body)
	assert.Len(t, got, 100)
	assert.ErrorIs(t, err, errCutMidway)
}

// TestTheTestOfACutKeepsTheFloor: after a cut, starts go one at a time
// until one is admitted, but the limit in force never goes below Min: the
// operator's floor is a count known to work.
func TestTheTestOfACutKeepsTheFloor(t *testing.T) {
	for _, floor := range []int{1, 3} {
		t.Run(fmt.Sprint("min ", floor), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: floor, Initial: 8, RetestMS: 60_000}})
				held := acquireN(t, g, 8)
				for _, h := range held {
					g.Report(h, admitted)
				}
				held[7].Slot.Release()
				next := acquireN(t, g, 1)[0]
				g.Report(next, refused) // 8 was proven: the cap fell
				next.Slot.Release()
				for _, h := range held[:7] {
					h.Slot.Release()
				}
				cut := g.Learned().Cap
				require.Less(t, cut, 8)

				test := acquireN(t, g, 1)[0] // the test of the cut
				l := g.Learned()
				assert.Equal(t, floor, l.Limit, "the limit while the test is out is the floor (Min %d)", floor)
				assert.GreaterOrEqual(t, l.Limit, floor)
				more := acquireN(t, g, floor-1) // up to the floor still start
				c := acquireAsync(context.Background(), g, "")
				synctest.Wait()
				assert.Empty(t, c, "nothing past the floor starts before the test is answered")
				g.Report(test, admitted)
				synctest.Wait()
				r := <-c
				require.NoError(t, r.err)
				for _, h := range append(more, test, r.g) {
					h.Slot.Release()
				}
				g.Close()
			})
		})
	}
}

// TestAFailedProbeProvesNothing: a probe whose exchange failed (Other: a
// reset, a dial error, a client gone) is withdrawn; it is not taken as
// admitted once its gap has passed, so an upstream that drops what is over
// its cap does not walk the cap up.
func TestAFailedProbeProvesNothing(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 60_000}})
		held := acquireN(t, g, 5)
		require.Equal(t, 5, held[4].InFlight, "the fifth is a probe")
		g.Report(held[4], pacing.Verdict{Kind: pacing.Other})
		held[4].Slot.Release()
		time.Sleep(3 * time.Second) // past any gap
		assert.Equal(t, 4, g.Learned().Cap)
		for _, h := range held[:4] {
			h.Slot.Release()
		}
		g.Close()
	})
}

// TestRaisingMinDuringTheTestOfACut: a floor raised while the test of a
// cut is out binds at once.
func TestRaisingMinDuringTheTestOfACut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := func(floor int) pacing.Config {
			return pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: floor, Initial: 8, RetestMS: 60_000}}
		}
		g := newGate(t, cfg(1))
		held := acquireN(t, g, 8)
		for _, h := range held {
			g.Report(h, admitted)
		}
		held[7].Slot.Release()
		next := acquireN(t, g, 1)[0]
		g.Report(next, refused)
		next.Slot.Release()
		for _, h := range held[:7] {
			h.Slot.Release()
		}
		test := acquireN(t, g, 1)[0] // the test of the cut is out
		require.Equal(t, 1, g.Learned().Limit)
		require.NoError(t, g.Reconfigure(cfg(3)))
		assert.Equal(t, 3, g.Learned().Limit, "the new floor")
		more := acquireN(t, g, 2)
		for _, h := range append(more, test) {
			h.Slot.Release()
		}
		g.Close()
	})
}

// TestAStaleFailureKeepsTheTestOfACut: a request started before a cut that
// fails afterwards (Other) is not a probe of the cut: the test of the cut
// stays out, and the limit with it.
func TestAStaleFailureKeepsTheTestOfACut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 10, Max: 10, RetestMS: 60_000}})
		held := acquireN(t, g, 10)
		g.Report(held[5], refused) // a cut
		for _, h := range held[:8] {
			h.Slot.Release()
		}
		test := acquireN(t, g, 1)[0]
		require.Equal(t, 1, g.Learned().Limit, "the test of the cut is out")
		g.Report(held[9], pacing.Verdict{Kind: pacing.Other}) // started before the cut
		assert.Equal(t, 1, g.Learned().Limit)
		for _, h := range append(held[8:], test) {
			h.Slot.Release()
		}
		g.Close()
	})
}

// TestOneStartTestsACut: after a cut, one start tests it and no other goes
// until it is answered, even when many waiters could start in one pass
// (here they waited out a Retry-After pause while holders finished).
func TestOneStartTestsACut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 10, Max: 10, RetestMS: 60_000}})
		held := acquireN(t, g, 10)
		for _, h := range held[:8] {
			g.Report(h, admitted)
		}
		g.Report(held[8], pacing.Verdict{Kind: pacing.Rate, RetryAfter: time.Second})
		var waiting []chan result
		for range 8 {
			waiting = append(waiting, acquireAsync(context.Background(), g, "m"))
		}
		synctest.Wait()
		for _, h := range held[:8] {
			h.Slot.Release()
		}
		g.Report(held[9], refused)                 // a cut, with 2 in flight and 8 waiting
		time.Sleep(time.Second + time.Millisecond) // the pause ends
		synctest.Wait()
		started := 0
		for _, c := range waiting {
			if len(c) == 1 {
				started++
			}
		}
		assert.Equal(t, 1, started, "the test of the cut alone")
		g.Close()
		for _, c := range waiting {
			if r := <-c; r.err == nil {
				r.g.Slot.Release()
			}
		}
		for _, h := range held[8:] {
			h.Slot.Release()
		}
	})
}

// TestLoweringMinDuringTheTestOfACut: a floor lowered while the test of a
// cut is out binds at once too.
func TestLoweringMinDuringTheTestOfACut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := func(floor int) pacing.Config {
			return pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: floor, Initial: 8, RetestMS: 60_000}}
		}
		g := newGate(t, cfg(3))
		held := acquireN(t, g, 8)
		g.Report(held[7], refused)
		for _, h := range held[:7] {
			h.Slot.Release()
		}
		test := acquireN(t, g, 1)[0]
		require.Equal(t, 3, g.Learned().Limit)
		require.NoError(t, g.Reconfigure(cfg(1)))
		assert.Equal(t, 1, g.Learned().Limit, "the new floor")
		test.Slot.Release()
		held[7].Slot.Release()
		g.Close()
	})
}

// TestReconfigureAfterCloseArmsNothing: a closed Gate given a new
// configuration arms none of its learners' timers again (Close stopped
// them; they fired later and went on learning for a Gate that was gone).
func TestReconfigureAfterCloseArmsNothing(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 1000},
			Models: map[string]pacing.ModelConfig{"m": {Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 1000}}}}
		g := newGate(t, cfg)
		held := acquireN(t, g, 4)
		g.Report(held[3], refused) // a cut: its test is armed
		require.Positive(t, pacing.ArmedTimers(g), "the scene arms a timer")
		g.Close()
		require.Zero(t, pacing.ArmedTimers(g))
		require.NoError(t, g.Reconfigure(cfg))
		assert.Zero(t, pacing.ArmedTimers(g), "none armed again")
		for _, h := range held {
			h.Slot.Release()
		}
	})
}

// TestRaisedCeilingIsNoCeilingFound: a configured cap raised before any
// 429 has found a ceiling leaves none found: the learned cap climbs from
// where it is at once, as it would have under the higher cap from the
// start, rather than holding the old bound as a ceiling until a retest.
func TestRaisedCeilingIsNoCeilingFound(t *testing.T) {
	for name, cfg := range map[string]func(n int) pacing.Config{
		"max_concurrent_requests": func(n int) pacing.Config {
			return pacing.Config{MaxConcurrentRequests: n, Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 3_600_000}}
		},
		"adaptive max": func(n int) pacing.Config {
			return pacing.Config{Adaptive: &pacing.AdaptiveConfig{Max: n, Initial: 4, RetestMS: 3_600_000}}
		},
		"a model's": func(n int) pacing.Config {
			return pacing.Config{Models: map[string]pacing.ModelConfig{
				"m": {MaxConcurrentRequests: n, Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 3_600_000}}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, cfg(4))
				held := acquireN(t, g, 4)
				for _, h := range held {
					g.Report(h, admitted)
				}
				require.NoError(t, g.Reconfigure(cfg(8)))
				l := g.Learned()
				if l.Models != nil {
					l = l.Models["m"]
				}
				assert.Equal(t, 8, l.Ceiling, "no ceiling found: the bound (Max when unknown)")
				require.Equal(t, 5, l.Limit, "a probe may go at once")
				held = append(held, acquireN(t, g, 1)...)
				for _, h := range held {
					h.Slot.Release()
				}
				g.Close()
			})
		})
	}
}
