package slots

import "time"

// UnusedUpgrades returns how many Done channels have upgraded connections
// listed as unused (upgrade.go).
func UnusedUpgrades() int {
	unusedUpgrades.Lock()
	defer unusedUpgrades.Unlock()
	return len(unusedUpgrades.m)
}

// SetDroppedUpgradeWait sets how long an unused upgraded connection of a
// server's request is kept after the request ended, and returns the
// function that puts the old value back.
func SetDroppedUpgradeWait(d time.Duration) func() {
	old := droppedUpgradeWait.Swap(int64(d))
	return func() { droppedUpgradeWait.Store(old) }
}
