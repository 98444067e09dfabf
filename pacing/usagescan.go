package pacing

// The usage of a JSON answer, found as its bytes pass (WatchUsage):
// without keeping the answer, however long it is.

import "bytes"

// Where a usage object is found in a JSON answer, in the order they are
// applied (see usageBody.apply): a message's (Anthropic's), the answer's
// own, a response's (OpenAI's Responses API events).
const (
	inMessage = iota
	inAnswer
	inResponse
	usagePlaces
)

// usageScan follows a JSON answer's strings and nesting as it passes, and
// keeps only its usage objects: the value of its "usage", and of the
// "usage" of its "message" and its "response", each up to MaxUsageBody
// bytes (a longer one is dropped). Keys are compared as they are written,
// escapes and all; nothing is checked beyond what finding them needs.
type usageScan struct {
	depth   int
	str     bool // in a string
	escaped bool // after a backslash in a string
	isKey   bool // the string is a key of an object at level 1 or 2
	// obj[l]: the container at level l (1 or 2) is an object; place[2]:
	// the place whose object is at level 2 (-1: none).
	obj   [3]bool
	place [3]int
	// wantKey: the next string is a key (after the opening brace or a
	// comma of an object at level 1 or 2).
	wantKey bool
	key     [8]byte // the last key read at level 1 or 2 (its first bytes)
	keyLen  int     // its length; more than len(key): none of ours
	// capturing: the place whose usage object is being kept, from its
	// opening brace at level capLevel (-1: none).
	capturing, capLevel int
	val                 []byte
	found               [usagePlaces][]byte
	ended               bool // the answer's object has closed (and so the answer)
	bad                 bool // it is no JSON object: nothing more is read
}

func newUsageScan() usageScan {
	return usageScan{capturing: -1, place: [3]int{-1, -1, -1}}
}

// feed takes the answer's next bytes.
func (s *usageScan) feed(p []byte) {
	if s.bad {
		return
	}
	from := 0 // where the captured value's bytes in p start
	for i := 0; i < len(p); i++ {
		if s.str {
			if s.escaped { // the byte after a backslash
				s.escaped = false
				continue
			}
			// To the string's end, or the next escape.
			j := bytes.IndexAny(p[i:], `"\`)
			if j < 0 {
				s.keyBytes(p[i:])
				break
			}
			s.keyBytes(p[i : i+j])
			i += j
			if p[i] == '\\' {
				s.escaped = true
				s.keyLen = len(s.key) + 1 // an escaped key is none of ours
				continue
			}
			s.str = false
			continue
		}
		switch p[i] {
		case '"':
			s.str = true
			s.isKey = s.wantKey && s.depth <= 2
			if s.isKey {
				s.keyLen = 0
			}
			s.wantKey = false
		case ':':
			s.wantKey = false
		case ',':
			s.wantKey = s.depth <= 2 && s.obj[s.depth]
		case '{', '[':
			if s.open(p[i] == '{'); s.bad {
				return
			}
			if s.capturing >= 0 && s.depth == s.capLevel {
				from = i
			}
		case '}', ']':
			if s.capturing >= 0 && s.depth == s.capLevel {
				s.val = append(s.val, p[from:i+1]...)
				if len(s.val) <= MaxUsageBody {
					s.found[s.capturing] = s.val
				}
				s.capturing, s.val = -1, nil
			}
			if s.depth == 0 {
				s.bad = true // a closing with nothing open: no JSON
				return
			}
			s.depth--
			s.wantKey = false
			if s.depth == 0 {
				s.ended = true
			}
		}
	}
	if s.capturing >= 0 && s.depth >= s.capLevel {
		if s.val = append(s.val, p[from:]...); len(s.val) > MaxUsageBody {
			s.capturing, s.val = -1, nil // too long to be a usage: dropped
		}
	}
}

// keyBytes takes the bytes of a string: those of a key are kept.
func (s *usageScan) keyBytes(b []byte) {
	if !s.isKey {
		return
	}
	if s.keyLen+len(b) <= len(s.key) {
		copy(s.key[s.keyLen:], b)
	}
	s.keyLen += len(b)
}

// keyIs reports whether the last key read is k.
func (s *usageScan) keyIs(k string) bool {
	return s.keyLen == len(k) && string(s.key[:s.keyLen]) == k
}

// open enters an object or an array, the value of the last key read if
// its container is an object at level 1 or 2.
func (s *usageScan) open(object bool) {
	s.depth++
	d := s.depth
	if d == 1 {
		s.ended, s.bad = false, !object // an answer that is no object has no usage
	}
	named := d >= 2 && d <= 3 && s.obj[d-1] && s.keyLen <= len(s.key)
	if d <= 2 {
		s.obj[d], s.place[d] = object, -1
	}
	s.wantKey = object && d <= 2
	if !named || !object || s.capturing >= 0 {
		return
	}
	switch {
	case d == 2 && s.keyIs("usage"):
		s.capturing, s.capLevel = inAnswer, d
	case d == 2 && s.keyIs("message"):
		s.place[2] = inMessage
	case d == 2 && s.keyIs("response"):
		s.place[2] = inResponse
	case d == 3 && s.place[2] >= 0 && s.keyIs("usage"):
		s.capturing, s.capLevel = s.place[2], d
	}
	if s.capturing >= 0 {
		s.val = s.val[:0]
	}
}
