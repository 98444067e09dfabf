package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGatewayBadConfigExits2(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]string{
		"negative org limit": `{"upstream":"http://127.0.0.1:1","orgs":{"default_limit":-1}}`,
		"bad provider":       `{"upstream":"http://127.0.0.1:1","provider":{"requests_per_minute":-5}}`,
		"no upstream":        `{}`,
		"unknown field":      `{"upstream":"http://127.0.0.1:1","orgz":{}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
			require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
			var stderr strings.Builder
			assert.Equal(t, 2, run([]string{"-config", path}, &stderr))
			assert.Contains(t, stderr.String(), "config:")
		})
	}
	assert.Equal(t, 2, run(nil, io.Discard), "-config is required")
}
