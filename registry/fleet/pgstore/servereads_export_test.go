package pgstore

// The texts revision 25 replaces, for servereads_diff_test.go: the latest
// inflight_serve before it (resume.sql's, as revision 22 made it again)
// and inflight_room (count.sql's), with the fleet's constants.
var (
	ServeBefore25 = bigintBounds
	RoomBefore25  = function(countSQL, "inflight_room")
)
