package core

// Len and Cap report the returns told and the room their list takes.
func (t *Told) Len() int { return len(t.dues) }
func (t *Told) Cap() int { return cap(t.dues) }
