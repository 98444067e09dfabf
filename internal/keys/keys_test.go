package keys

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDedupe(t *testing.T) {
	assert.Equal(t, []string{}, Dedupe([]string(nil)))
	assert.Equal(t, []string{"a", "b"}, Dedupe([]string{"a", "b", "a", "b", "a"}))
	var many, want []int
	for i := range 40 {
		many = append(many, i%13, i%13)
		if i < 13 {
			want = append(want, i)
		}
	}
	assert.Equal(t, want, Dedupe(many), "first-seen order, past the scan's size")
	in := []int{3, 1, 3}
	out := Dedupe(in)
	out[0] = 9
	assert.Equal(t, []int{3, 1, 3}, in, "a new slice")
}

func TestRemade(t *testing.T) {
	m := map[string]int{}
	peak := 0
	for i := range 100 {
		m[fmt.Sprint(i)] = i
		peak = max(peak, len(m))
	}
	for i := range 74 {
		delete(m, fmt.Sprint(i))
	}
	same := Remade(m, &peak, 0)
	same["x"] = 1
	assert.Equal(t, 1, m["x"], "26 of a peak of 100: kept")
	delete(m, "x")
	delete(m, "74")
	fresh := Remade(m, &peak, 0)
	assert.Equal(t, m, fresh)
	assert.Equal(t, 25, peak, "a quarter: made anew, the peak reset")
	fresh["y"] = 1
	_, shared := m["y"]
	assert.False(t, shared, "a copy")
	peak = 100
	kept := Remade(m, &peak, 1024)
	kept["z"] = 1
	assert.Equal(t, 1, m["z"], "under minPeak: kept")
}

// TestTrimmed: a slice keeps its array until it is down to a quarter of
// it (from minCap on); then the copy holds only what is live. Empty is nil.
func TestTrimmed(t *testing.T) {
	s := make([]int, 100)
	assert.Equal(t, 100, cap(Trimmed(s[:26], 64)), "over a quarter: kept")
	trimmed := Trimmed(s[:25], 64)
	assert.Len(t, trimmed, 25)
	assert.Less(t, cap(trimmed), 100, "a quarter: copied")
	assert.Equal(t, 50, cap(Trimmed(make([]int, 1, 50), 64)), "under minCap: kept")
	assert.Nil(t, Trimmed(s[:0], 64))
}
