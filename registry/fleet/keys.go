package fleet

import (
	"fmt"
	"reflect"

	"github.com/inflight-go/inflight/registry"
)

// The rule for keys is the local registry's (registry.ErrInvalidKey): a key
// of a string type longer than the bound, or a key unequal to itself (it
// holds a NaN) or that cannot be compared (an interface holding a slice), is
// refused. The fleet checks it before anything goes to Redis, so that a key
// is refused whether Redis decides or the local registry alone does; the
// local registry is given the same bound (New). TestKeyRuleOnBothPaths
// holds the two checks to the same answers.

// keyRule returns how to measure K's keys against a bound of maxBytes (nil:
// no bound, or K is not a string type), and whether K's values can be
// unequal to themselves.
func keyRule[K comparable](maxBytes int) (keyLen func(K) int, selfCheck bool) {
	t := reflect.TypeFor[K]()
	if maxBytes > 0 && t.Kind() == reflect.String {
		keyLen = func(k K) int { return reflect.ValueOf(k).Len() }
	}
	return keyLen, canBeUnequal(t)
}

// canBeUnequal reports whether a value of t may be unequal to itself (a
// float or complex NaN, inside anything) or panic when compared (an
// interface).
func canBeUnequal(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.Interface:
		return true
	case reflect.Array:
		return canBeUnequal(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if canBeUnequal(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

// validKey returns an error wrapping registry.ErrInvalidKey if key breaks
// the rule.
func (r *Registry[K]) validKey(key K) error {
	if r.keyLen != nil {
		if n := r.keyLen(key); n > r.cfg.maxKeyBytes {
			return fmt.Errorf("fleet: %w: %d bytes, over the %d-byte bound", registry.ErrInvalidKey, n, r.cfg.maxKeyBytes)
		}
	}
	if r.selfCheck && !sameAsItself(key) {
		return fmt.Errorf("fleet: %w: the key is not equal to itself (NaN), or cannot be compared", registry.ErrInvalidKey)
	}
	return nil
}

// sameAsItself is false for a key that no map could find again, or that
// panics when compared.
func sameAsItself[K comparable](key K) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return key == key
}
