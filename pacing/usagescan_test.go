package pacing_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// randomJSON returns a random JSON value of depth at most depth: objects
// whose keys are often "usage", "message" or "response", usage-shaped
// objects, and strings full of quotes, backslashes and braces.
func randomJSON(rng *rand.Rand, depth int) any {
	keys := []string{"usage", "message", "response", "choices", "content", "prompt_tokens", "x"}
	strs := []string{`"usage":{"prompt_tokens":7}`, `\`, `"`, `{`, `}]`, "é\u2028", ``, `\"usage\"`}
	switch k := rng.IntN(7); {
	case depth == 0 || k == 0:
		return strs[rng.IntN(len(strs))] + fmt.Sprint(rng.IntN(100))
	case k == 1:
		return rng.IntN(1000)
	case k == 2:
		return nil
	case k == 3:
		return map[string]any{"prompt_tokens": rng.IntN(50), "completion_tokens": rng.IntN(50), "input_tokens": rng.IntN(50)}
	case k == 4:
		a := make([]any, rng.IntN(3))
		for i := range a {
			a[i] = randomJSON(rng, depth-1)
		}
		return a
	default:
		m := map[string]any{}
		for range rng.IntN(4) {
			m[keys[rng.IntN(len(keys))]] = randomJSON(rng, depth-1)
		}
		return m
	}
}

// usageOf is what WatchUsage should report for a JSON answer, as the
// library decoded it when it kept the whole answer (with encoding/json),
// each key decoded on its own: nil when there is none.
func usageOf(doc []byte) []pacing.Tokens {
	var top map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil {
		return nil
	}
	var in, out int
	gotIn, gotOut := false, false
	apply := func(raw json.RawMessage, counts bool) {
		var u *struct {
			PromptTokens     *int `json:"prompt_tokens"`
			CompletionTokens *int `json:"completion_tokens"`
			InputTokens      *int `json:"input_tokens"`
			OutputTokens     *int `json:"output_tokens"`
		}
		if raw == nil || json.Unmarshal(raw, &u) != nil || u == nil {
			return
		}
		if p := u.PromptTokens; p != nil || u.InputTokens != nil {
			if p == nil {
				p = u.InputTokens
			}
			in, gotIn = max(*p, 0), true
		}
		if c := u.CompletionTokens; c != nil || u.OutputTokens != nil {
			if c == nil {
				c = u.OutputTokens
			}
			out, gotOut = max(*c, 0), counts
		}
	}
	nested := func(raw json.RawMessage) json.RawMessage {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil
		}
		return m["usage"]
	}
	apply(nested(top["message"]), false)
	apply(top["usage"], true)
	apply(nested(top["response"]), true)
	if !gotIn && !gotOut {
		return nil
	}
	return []pacing.Tokens{{Input: in, Output: out}}
}

// WatchUsage finds in a JSON answer, as it passes in reads of any size,
// the usage the whole answer decoded with encoding/json has: thousands of
// random answers, each read in random pieces.
func TestWatchUsageScansAsJSONDecodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	found := 0
	for i := range 5000 {
		m := map[string]any{}
		for range rng.IntN(5) {
			k := []string{"usage", "message", "response", "choices", "id"}[rng.IntN(5)]
			v := randomJSON(rng, 4)
			if rng.IntN(2) == 0 { // often where a usage is read
				u := randomJSON(rng, 0)
				if rng.IntN(3) > 0 {
					u = map[string]any{"prompt_tokens": rng.IntN(50) - 5, "output_tokens": rng.IntN(50)}
				}
				v = u
				if k != "usage" {
					v = map[string]any{"usage": u, "content": randomJSON(rng, 3)}
				}
			}
			m[k] = v
		}
		doc, err := json.Marshal(m)
		require.NoError(t, err)
		if rng.IntN(3) == 0 { // as some servers write it
			doc, err = json.MarshalIndent(m, "", "  ")
			require.NoError(t, err)
		}
		want := usageOf(doc)
		found += len(want)
		var got []pacing.Tokens
		rc := pacing.WatchUsage(io.NopCloser(&pieces{r: strings.NewReader(string(doc)), rng: rng}), "application/json",
			func(u pacing.Tokens) { got = append(got, u) })
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
		require.Equal(t, string(doc), string(b))
		require.Equal(t, want, got, "answer %d: %s", i, doc)
	}
	t.Logf("%d of 5000 answers had a usage", found)
	require.Greater(t, found, 1000, "the answers exercise the usage's places")
}

// pieces reads r in pieces of random sizes, from one byte.
type pieces struct {
	r   io.Reader
	rng *rand.Rand
}

func (p *pieces) Read(b []byte) (int, error) {
	return p.r.Read(b[:min(len(b), 1+p.rng.IntN(9))])
}

// BenchmarkWatchUsageJSON reads a JSON answer of about 100 kB (a long
// completion) through WatchUsage in 4 kB reads, beside the same reads
// without it.
func BenchmarkWatchUsageJSON(b *testing.B) {
	content, err := json.Marshal(strings.Repeat(`token "quoted" \ and more `, 4000))
	require.NoError(b, err)
	doc := []byte(`{"id":"x","choices":[{"message":{"role":"assistant","content":` + string(content) +
		`}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`)
	answer := string(doc)
	buf := make([]byte, 4096)
	for _, watched := range []bool{false, true} {
		b.Run(map[bool]string{false: "bare", true: "watched"}[watched], func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				var rc io.ReadCloser = io.NopCloser(strings.NewReader(answer))
				if watched {
					rc = pacing.WatchUsage(rc, "application/json", func(pacing.Tokens) {})
				}
				for {
					if _, err := rc.Read(buf); err != nil {
						break
					}
				}
				rc.Close()
			}
		})
	}
}
