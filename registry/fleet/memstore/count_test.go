package memstore

import "testing"

// A key's count is kept until a lease changes: weighing a lease held
// forgets it, as holding, granting and dropping one do.
func TestWeighForgetsTheCount(t *testing.T) {
	k := New().key("k")
	k.hold("a", 10)
	if n := k.count(0); n != 1 {
		t.Fatalf("count = %d, want 1", n)
	}
	k.weigh("a", 3)
	if n := k.count(0); n != 3 {
		t.Fatalf("count after weigh = %d, want 3", n)
	}
	k.drop("a")
	if n := k.count(0); n != 0 {
		t.Fatalf("count after drop = %d, want 0", n)
	}
}
