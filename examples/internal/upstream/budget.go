package upstream

import (
	"sync"
	"time"

	"github.com/tiktoken-go/tokenizer"
)

// codec is o200k_base, made once, when first needed.
var codec = sync.OnceValues(func() (tokenizer.Codec, error) { return tokenizer.Get(tokenizer.O200kBase) })

// SetTokensPerMinute turns the budget mode on (n > 0) or off: like a
// provider's tokens-per-minute limit, the provider then answers 429 to a
// request whose prompt would take the tokens of the requests started in
// the last minute (their prompts, and their answers as far as they have
// streamed) over n. A request's answer is as long as its turn, or its
// max_tokens, a token every 20 ms; asked with stream_options.include_usage,
// its last chunk reports its usage. Call it before serving.
func (p *Provider) SetTokensPerMinute(n int64) error {
	if _, err := codec(); n > 0 && err != nil {
		return err
	}
	p.minute.mu.Lock()
	p.minute.limit = n
	p.minute.mu.Unlock()
	return nil
}

// minuteLog is the budget mode's record: every request started, and the
// tokens it has taken.
type minuteLog struct {
	mu     sync.Mutex
	limit  int64 // 0: off
	starts []*tokenStart
	first  int // starts before it left the last minute at the latest start
}

type tokenStart struct {
	at time.Time
	n  int64
}

// start admits a request with a prompt of n tokens now, or reports it
// over the budget; nil when the mode is off.
func (m *minuteLog) start(n int64) (*tokenStart, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.limit == 0 {
		return nil, false
	}
	now := time.Now() // under the lock: starts stay in time order
	for m.first < len(m.starts) && now.Sub(m.starts[m.first].at) >= time.Minute {
		m.first++
	}
	var sum int64
	for _, s := range m.starts[m.first:] {
		sum += s.n
	}
	if sum+n > m.limit {
		return nil, true
	}
	s := &tokenStart{at: now, n: n}
	m.starts = append(m.starts, s)
	return s, false
}

// add counts n more tokens (an answer's) to a start.
func (m *minuteLog) add(s *tokenStart, n int64) {
	if s == nil {
		return
	}
	m.mu.Lock()
	s.n += n
	m.mu.Unlock()
}

// WorstMinute returns the most tokens started in any minute in the budget
// mode (prompts and answers, by the time each request started), and how
// many requests started.
func (p *Provider) WorstMinute() (tokens int64, requests int) {
	m := &p.minute
	m.mu.Lock()
	defer m.mu.Unlock()
	j := 0
	var sum int64
	for i, s := range m.starts { // starts are in time order
		for ; j < len(m.starts) && m.starts[j].at.Sub(s.at) < time.Minute; j++ {
			sum += m.starts[j].n
		}
		tokens = max(tokens, sum)
		sum -= m.starts[i].n
	}
	return tokens, len(m.starts)
}

// ResetMinute forgets the budget mode's record, between runs.
func (p *Provider) ResetMinute() {
	p.minute.mu.Lock()
	p.minute.starts, p.minute.first = nil, 0
	p.minute.mu.Unlock()
}
