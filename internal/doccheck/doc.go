// Package doccheck holds a test of the whole repository's documentation;
// it has no code.
package doccheck
