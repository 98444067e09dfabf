//go:build !race

package testrig

const raceEnabled = false
