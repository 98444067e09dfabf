package pgtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The package's example, run.
func TestFleetOnPostgres(t *testing.T) { fleetOnPostgres(t) }
