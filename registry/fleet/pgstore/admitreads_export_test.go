package pgstore

// The texts revision 26 replaces, for admitreads_diff_test.go: the latest
// inflight_admit and inflight_still_queued before it (queuedkey.sql's,
// the latter as revision 22 made it again), with the fleet's constants.
var (
	AdmitBefore26       = withConstants(function(queuedKeySQL, "inflight_admit"))
	StillQueuedBefore26 = withConstants(function(queuedKeySQL, "inflight_still_queued"))
)
