package registry

// table is a shard's index from key to live entry: open addressing with
// linear probing, keyed by the hash that already chose the shard.
//
// A Go map would hash every key a second time, and reseeds itself each time
// it empties, which for a shard whose keys come and go is on every release;
// together that was about a third of an admission. This table also shrinks
// as keys go idle, which a Go map never does.
//
// Deletion shifts the following run back instead of leaving tombstones, so a
// probe ends at the first empty slot and nothing decays with churn.
//
// It pays its way in BenchmarkRegistryTryAcquireRelease: with a Go map per
// shard in its place (rebuilt smaller once it falls to an eighth of its
// peak), over five interleaved runs on two cores, the registry went from
// 0.96x to 1.32x its mutex+map baseline (median; target 0.8x), at 1
// alloc/op either way; BenchmarkRegistryTryAcquireReleaseParallel went from
// 0.65x to 0.97x.
type table[K comparable] struct {
	slots []tslot[K] // length 0 or a power of two
	n     int32      // occupied slots
	shift uint32     // hash bits taken by the shard index
}

type tslot[K comparable] struct {
	hash uint64 // the key's hash with occupiedBit set; 0 when empty
	e    *entry[K]
}

const (
	occupiedBit  = 1 << 63
	minTableSize = 8
)

// home is where a hash's probe starts. The low bits chose the shard, so the
// index comes from the bits above them; occupiedBit, far above the index,
// changes nothing (remove passes a hash without it).
func (t *table[K]) home(h uint64) int {
	return int((h >> t.shift) & uint64(len(t.slots)-1))
}

// get returns key's live entry, h its hash, or nil.
func (t *table[K]) get(key K, h uint64) *entry[K] {
	if t.n == 0 {
		return nil
	}
	h |= occupiedBit
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.hash == 0 {
			return nil
		}
		if s.hash == h && s.e.key == key {
			return s.e
		}
	}
}

// put adds e, whose key must not be in t.
func (t *table[K]) put(e *entry[K], h uint64) {
	if int(t.n+1)*2 > len(t.slots) { // keep the load at most one half
		t.resize(max(minTableSize, len(t.slots)*2))
	}
	t.insert(e, h|occupiedBit)
	t.n++
}

func (t *table[K]) insert(e *entry[K], h uint64) {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = tslot[K]{h, e}
}

// remove deletes e, which must be in t.
func (t *table[K]) remove(e *entry[K], h uint64) {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].e != e {
		i = (i + 1) & mask
	}
	// Shift back each later slot of the run whose home does not lie in
	// (i, j], so that every key stays reachable from its home.
	for j := (i + 1) & mask; t.slots[j].hash != 0; j = (j + 1) & mask {
		k := t.home(t.slots[j].hash)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tslot[K]{}
	t.n--
	if len(t.slots) > minTableSize && int(t.n)*8 < len(t.slots) {
		t.resize(len(t.slots) / 4)
	}
}

func (t *table[K]) resize(size int) {
	old := t.slots
	t.slots = make([]tslot[K], size)
	for _, s := range old {
		if s.hash != 0 {
			t.insert(s.e, s.hash)
		}
	}
}

// each calls fn for every entry, in no particular order.
func (t *table[K]) each(fn func(*entry[K])) {
	for _, s := range t.slots {
		if s.hash != 0 {
			fn(s.e)
		}
	}
}
