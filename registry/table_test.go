package registry

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTableAgainstMap drives the table and a Go map with the same random
// inserts and removes, with hashes crowded into few homes so that runs wrap
// around the end and deletions shift long runs back.
func TestTableAgainstMap(t *testing.T) {
	for _, shardBits := range []uint{0, 3} {
		rng := rand.New(rand.NewPCG(1, uint64(shardBits)))
		tb := table[int]{shift: uint32(shardBits)}
		model := map[int]*entry[int]{}
		hash := func(k int) uint64 { return uint64(k%7) << shardBits * 0x9e3779b97f4a7c15 >> 60 << shardBits }
		for step := range 20_000 {
			k := rng.IntN(300)
			if e, ok := model[k]; ok && rng.IntN(2) == 0 {
				tb.remove(e, hash(k))
				delete(model, k)
			} else if !ok {
				e := &entry[int]{key: k}
				tb.put(e, hash(k))
				model[k] = e
			}
			require.Equal(t, len(model), int(tb.n), "step %d", step)
			if step%97 == 0 {
				for k := range 300 {
					assert.Same(t, model[k], tb.get(k, hash(k)), "key %d at step %d", k, step)
				}
				n := 0
				tb.each(func(*entry[int]) { n++ })
				assert.Equal(t, len(model), n)
			}
		}
		for k, e := range model {
			tb.remove(e, hash(k))
		}
		assert.Equal(t, int32(0), tb.n)
		assert.Equal(t, minTableSize, len(tb.slots), "the table shrinks back as it empties")
	}
}
