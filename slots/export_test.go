package slots

// UnusedUpgrades returns how many Done channels have upgraded connections
// listed as unused (upgrade.go).
func UnusedUpgrades() int {
	unusedUpgrades.Lock()
	defer unusedUpgrades.Unlock()
	return len(unusedUpgrades.m)
}
