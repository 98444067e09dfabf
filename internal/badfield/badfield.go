// Package badfield words the error of a configuration field out of range,
// for every configuration of the module (pacing's, and its learners' and
// budgets' sections in package pacing/upstream): the field by its JSON
// path, its value, and why it is refused.
package badfield

import "fmt"

// Error returns the error of field (its JSON path, such as
// `models["glm-5"].max_queue`) whose value v is refused for why ("is
// negative").
func Error(field string, v any, why string) error {
	return fmt.Errorf("pacing: %s: %v %s", field, v, why)
}
