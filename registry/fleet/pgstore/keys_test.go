package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
)

// Keys that a text column and its index take are stored as they are;
// any other is `\x` and the hex SHA-256 of its bytes, so that no two keys
// meet and a kept key never looks like a hashed one.
func TestStoredKey(t *testing.T) {
	for _, k := range []string{"provider", "model:gpt-4o", "ключ", "", strings.Repeat("k", 512), `a\x`} {
		assert.Equal(t, k, pgstore.StoredKey(k), "%.40q kept", k)
	}
	seen := map[string]string{}
	for _, k := range []string{"\xff", "\xfe", "a\x00b", `\x`, `\x00`, strings.Repeat("k", 513), strings.Repeat("k", 4096)} {
		got := pgstore.StoredKey(k)
		assert.Regexp(t, `^\\x[0-9a-f]{64}$`, got, "%.40q hashed", k)
		assert.NotContains(t, seen, got, "%.40q meets %.40q", k, seen[got])
		seen[got] = k
	}
	assert.Equal(t, pgstore.StoredKey("\xff"), pgstore.StoredKey("\xff"), "the same key, the same text")
}

// A fleet name is kept as it is, so New refuses one the tables cannot
// keep, before it reaches the database (none listens here).
func TestFleetNameRefused(t *testing.T) {
	p, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	defer p.Close()
	for _, name := range []string{"", "\xff", "a\x00b", `\xabc`, strings.Repeat("n", 513)} {
		_, err := pgstore.New(context.Background(), p, name)
		require.Error(t, err, "%.40q", name)
		assert.Contains(t, err.Error(), "fleet name")
	}
}
