package pgstore

// MigrateTo is Migrate up to a revision: the database as a release before
// this one leaves it.
var MigrateTo = migrate

// ProbePayload is the payload of Listen's probes.
const ProbePayload = probePayload

// Function is function: a function's definition taken from a file.
var Function = function

// Edited is edited: a function's text with one line changed.
var Edited = edited
