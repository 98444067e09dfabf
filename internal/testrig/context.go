package testrig

import "context"

// endsOnLookup is a context that ends the first time a value is looked up
// in it.
type endsOnLookup struct {
	context.Context
	cancel context.CancelFunc
}

func (c endsOnLookup) Value(key any) any {
	c.cancel()
	return c.Context.Value(key)
}

// EndsOnLookup returns a context that ends the first time a value is looked
// up in it. An admission reads the caller's class from its context (with
// shares, before it decides), so the context ends after any check made
// earlier and before the decision: the window of golang/go#63615.
func EndsOnLookup() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	return endsOnLookup{ctx, cancel}
}
