package testrig

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that many goroutines may write to at once (a
// logger's handler, say) while a test reads what they wrote.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
