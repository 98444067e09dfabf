package learn

// Kind is what an upstream's answer says about its limits; upstream.Kind
// declares its values from these.
type Kind uint8

// The kinds of answer, in upstream.Kind's order.
const (
	KindOther Kind = iota
	KindAdmitted
	KindConcurrency
	KindRate
	KindOverload
	KindQuota
)

// Step is what one answer tells one learned cap on its request's path.
type Step uint8

const (
	// Withdrawn: the answer proves nothing of this cap (a refusal laid to
	// a more specific one, a rate limit, a quota, a failure); a test of it
	// the request was is withdrawn (Cap.Inconclusive), so that time does
	// not take it for admitted.
	Withdrawn Step = iota
	// Proved: the upstream took the request under this cap (Cap.Admitted).
	Proved
	// Cut: refused for concurrency, and laid to this cap (Cap.Refused).
	Cut
	// Eased: the provider is overloaded; this cap comes down a little
	// (Cap.Overloaded).
	Eased
)

// Route is the one rule by which an answer of kind k reaches the learned
// caps a request was admitted under (a provider's, an API key's, a
// model's; a fleet's keys): an admission proves each of them, a refusal
// for concurrency or an overload is laid to the most specific one
// (specific), and anything else proves nothing. The pacing Gate and a
// fleet Registry both route their reports by it.
func Route(k Kind, specific bool) Step {
	switch {
	case k == KindAdmitted:
		return Proved
	case specific && k == KindConcurrency:
		return Cut
	case specific && k == KindOverload:
		return Eased
	}
	return Withdrawn
}

// Answer is one answer on a request's path as one learned cap hears it:
// the step Route gave it, the cap's count with the request's start (N),
// the start's number and time (ID, At), the answer's time (Now) and the
// last start's number when it came (Seq).
type Answer struct {
	Step    Step
	N       int
	ID, Seq uint64
	At, Now int64
}

// Take applies a to l: the one place a Step becomes a change of a cap.
func (l *Cap) Take(a Answer) {
	switch a.Step {
	case Proved:
		l.Admitted(a.N, a.ID, a.Seq)
	case Cut:
		l.Refused(a.N, a.ID, a.At, a.Now, a.Seq)
	case Eased:
		l.Overloaded(a.ID, a.Seq)
	default:
		l.Inconclusive(a.N, a.ID, a.At)
	}
}
