package pacing

import (
	"cmp"
	"slices"
	"time"

	"github.com/inflight-go/inflight/pacing/upstream"
)

// The window a budget counts over, and its resolution: a request is
// counted in the second it started, and a second is counted whole while
// any of it lies within the last minute, so that over every minute at
// most the budget starts (and a little of the budget may idle).
const (
	budgetWindow = time.Minute
	budgetStep   = time.Second
	budgetSteps  = int64(budgetWindow / budgetStep) // the steps a window spans, besides the current one
	budgetRing   = 64                               // > budgetSteps, a power of two
)

// window counts the tokens started in the last minute under one budget,
// per second; its zero value is no budget.
type window struct {
	limit  int64 // per minute; 0: none
	total  int64 // the steps' sum
	cur    int64 // the step of the latest time seen (advance)
	queued int64 // the charges of the requests waiting in the Gate's queue
	steps  [budgetRing]int64
}

// advance forgets the steps that have left the window at now.
func (w *window) advance(now int64) {
	s := now / int64(budgetStep)
	if s <= w.cur {
		return
	}
	// Steps cur-budgetSteps .. s-budgetSteps-1 leave; at most a ring's worth
	// hold anything.
	from := max(w.cur-budgetSteps, s-budgetSteps-budgetRing)
	for i := from; i < s-budgetSteps; i++ {
		w.total -= w.steps[i&(budgetRing-1)]
		w.steps[i&(budgetRing-1)] = 0
	}
	w.cur = s
}

// fitAt returns 0 when c more tokens may start at now, else the clock time
// they may: when enough of what started has left the window. A budget with
// nothing in its window takes any charge, however large: its first
// request always passes.
func (w *window) fitAt(c, now int64) int64 {
	if w.limit == 0 {
		return 0
	}
	w.advance(now)
	if w.total <= 0 || w.total+c <= w.limit {
		return 0
	}
	left := w.total
	for i := w.cur - budgetSteps; i <= w.cur; i++ {
		left -= w.steps[i&(budgetRing-1)]
		if left <= 0 || left+c <= w.limit {
			// Step i leaves once the current step is i+budgetSteps+1.
			return (i + budgetSteps + 1) * int64(budgetStep)
		}
	}
	return (w.cur + budgetSteps + 1) * int64(budgetStep) // not reached: left ends at 0
}

// charge counts c started at now. A window counts whether its limit is
// set or not, so that a budget set by Reconfigure while requests are in
// flight corrects only what it charged.
func (w *window) charge(c, now int64) {
	w.advance(now)
	w.steps[w.cur&(budgetRing-1)] += c
	w.total += c
}

// correct changes by d the charge made in step s, at now: in that step
// while it is still in the window (what started then is what the window
// counts), else, for more than was charged, in the current step, as a
// debt. What was overcharged in a step that has left needs no return.
func (w *window) correct(s, d, now int64) {
	if d == 0 {
		return
	}
	w.advance(now)
	switch {
	case s >= w.cur-budgetSteps:
		w.steps[s&(budgetRing-1)] += d
		w.total += d
	case d > 0:
		w.steps[w.cur&(budgetRing-1)] += d
		w.total += d
	}
}

// resetIn is how long until all the window counts now has left it.
func (w *window) resetIn(now int64) time.Duration {
	w.advance(now)
	for i := w.cur; i >= w.cur-budgetSteps; i-- {
		if w.steps[i&(budgetRing-1)] != 0 {
			return time.Duration((i+budgetSteps+1)*int64(budgetStep) - now)
		}
	}
	return 0
}

// left is what the budget has left at now; negative in debt.
func (w *window) left(now int64) int64 {
	w.advance(now)
	return w.limit - w.total
}

// budgets are a lane's budgets per minute, indexed as budgetCaps; nil
// when it has none.
type budgets struct {
	w [budgetParts]window
	// The refused requests told to come back (their Retry-After), not yet
	// due, and their charges' sum: later refusals are told to come back
	// after them, so that they come back spread over the refill.
	told    []toldEntry
	toldSum charges
	// What the settled requests were estimated to cost and used, decayed
	// (correct): waiting scales the estimates of those waiting by it.
	estSum, usedSum [budgetParts]float64
}

// charges are what requests charge each part of budgets, indexed as
// budgetCaps (upstream.Charge).
type charges = [budgetParts]int64

const budgetParts = upstream.BudgetParts

type toldEntry struct {
	at int64 // when it was told to come back, clock nanos
	c  charges
}

// newBudgets returns budgets with those limits, or nil when all are 0.
// Counts in old, the lane's budgets until now, are kept.
func newBudgets(old *budgets, limits [budgetParts]int) *budgets {
	if limits == [budgetParts]int{} {
		return nil
	}
	b := old
	if b == nil {
		b = new(budgets)
	}
	for i, l := range limits {
		b.w[i].limit = int64(l)
	}
	// The refusals told to come back count as tell counted them, capped
	// at the limits now: a part given a limit since counts at most it.
	b.toldSum = charges{}
	for j := range b.told {
		b.told[j].c = b.capped(b.told[j].c)
		b.addTold(b.told[j].c, 1)
	}
	return b
}

// empty reports whether b's minute counts nothing at now.
func (b *budgets) empty(now int64) bool {
	for i := range b.w {
		b.w[i].advance(now)
		if b.w[i].total != 0 {
			return false
		}
	}
	return true
}

// fitAt is window.fitAt over all of b: 0 when t fits each, else the latest
// of their times, with the index of the budget that binds then. Zero
// Tokens (a request whose tokens nobody counted) fit every token budget.
// With extra, t comes after that much more (the requests queued before
// it), and each whole budget of it takes a minute more.
func (b *budgets) fitAt(t Tokens, extra charges, now int64) (at int64, which int) {
	if b == nil {
		return 0, -1
	}
	which = -1
	ch := upstream.Charge(t)
	capped := b.capped(ch) // a copy
	for i := range b.w {
		if t == (Tokens{}) && i < budgetParts-1 {
			continue // tokens nobody counted wait for no token budget
		}
		w := &b.w[i]
		own := ch[i]
		if extra[i] > 0 { // behind others: it needs but one empty minute (capped)
			own = capped[i]
		}
		c, more := own+extra[i], int64(0)
		if w.limit > 0 && extra[i] > 0 && c > w.limit {
			more = (c - 1) / w.limit
			c -= more * w.limit
		}
		a := w.fitAt(c, now)
		if more > 0 {
			a = max(a, now) + more*int64(budgetWindow+budgetStep)
		}
		if a > at {
			at, which = a, i
		}
	}
	return at, which
}

func (b *budgets) charge(t Tokens, now int64) {
	if b == nil {
		return
	}
	c := upstream.Charge(t)
	for i := range b.w {
		b.w[i].charge(c[i], now)
	}
}

// How a request ended, for its budgets' correction (budgets.correct).
const (
	endedUsage    = iota // served, with the usage the upstream reported: counted in the ratio of use to estimate
	endedSent            // answered without use (a redirect, a client error): its tokens back, its request stays
	endedUnserved        // refused by the upstream, given back, never sent: all of it back, its request too
	endedMoved           // not ended: all of it back from its step, to be charged again in another (Reservation.Start)
)

// correct changes what was charged in step s from was to is, for a
// request that ended so (endedUsage...).
func (b *budgets) correct(s int64, was, is Tokens, ended int, now int64) {
	if b == nil {
		return
	}
	from, to := upstream.Charge(was), upstream.Charge(is)
	if ended == endedUnserved || ended == endedMoved {
		to[budgetParts-1] = 0
	}
	for i := range b.w {
		b.w[i].correct(s, to[i]-from[i], now)
		if ended == endedUsage {
			b.estSum[i] = b.estSum[i]*ratioDecay + float64(from[i])
			b.usedSum[i] = b.usedSum[i]*ratioDecay + float64(to[i])
		}
	}
}

// ratioDecay weighs the requests settled before the latest one in the
// ratio of use to estimate: about the last hundred count.
const ratioDecay = 0.99

// ratio is how much of their estimates requests have used lately under
// budget i (1 before any has settled), within [1/16, 4].
func (b *budgets) ratio(i int) float64 {
	if b.estSum[i] <= 0 {
		return 1
	}
	return min(max(b.usedSum[i]/b.estSum[i], 1.0/16), 4)
}

// queue counts (sign 1) or uncounts (-1) a request costing t as queued
// for b, capped as fitAt counts it. Gate.requeueLocked counts the queue
// anew when limits change.
func (b *budgets) queue(t Tokens, sign int64) {
	if b == nil {
		return
	}
	c := b.capped(upstream.Charge(t))
	for i := range b.w {
		b.w[i].queued += sign * c[i]
	}
}

// unqueueAll counts nothing as queued for b.
func (b *budgets) unqueueAll() {
	if b == nil {
		return
	}
	for i := range b.w {
		b.w[i].queued = 0
	}
}

// capped is c with each part at most its budget's limit: a request larger
// than a budget takes one empty minute of it (a window's first request
// passes), not one per budget's worth of it.
func (b *budgets) capped(c charges) charges {
	for i := range c {
		if l := b.w[i].limit; l > 0 {
			c[i] = min(c[i], l)
		}
	}
	return c
}

// waiting returns what the requests queued for b's budgets are estimated
// to cost, and with told also those told to come back after now, scaled
// by what requests have used of their estimates lately (an estimate of
// the most they may answer is mostly more than they do).
func (b *budgets) waiting(told bool, now int64) (q charges) {
	if b == nil {
		return q
	}
	b.dueTold(now)
	for i := range b.w {
		q[i] = int64(float64(b.w[i].queued) * b.ratio(i))
		if told {
			q[i] += b.toldBound(i)
		}
	}
	return q
}

// status appends b's budgets that are set to st, for model or key (both
// "" for the provider's).
func (b *budgets) status(st []BudgetStatus, model, key string, now int64) []BudgetStatus {
	if b == nil {
		return st
	}
	for i := range b.w {
		if w := &b.w[i]; w.limit > 0 {
			st = append(st, BudgetStatus{Cap: budgetCaps[i], Model: model, Key: key, Limit: int(w.limit), Left: int(w.left(now)),
				ResetIn: w.resetIn(now), Queued: int(w.queued)})
		}
	}
	return st
}

// tell counts a request refused with t as coming back at at, and drops
// those due by now. At most maxTold are kept (the one due last is
// forgotten first).
func (b *budgets) tell(t Tokens, at, now int64) {
	if b == nil {
		return
	}
	b.dueTold(now)
	if len(b.told) == maxTold { // the one due last is forgotten
		if at >= b.told[len(b.told)-1].at {
			return
		}
		b.addTold(b.told[len(b.told)-1].c, -1)
		b.told = b.told[:len(b.told)-1]
	}
	// In the order they are due, so that dueTold drops a prefix.
	c := b.capped(upstream.Charge(t)) // as fitAt counts it
	i, _ := slices.BinarySearchFunc(b.told, at, func(e toldEntry, at int64) int { return cmp.Compare(e.at, at+1) })
	b.told = slices.Insert(b.told, i, toldEntry{at, c})
	b.addTold(c, 1)
}

// addTold adds sign times c to the told requests' sum.
func (b *budgets) addTold(c charges, sign int64) {
	for i := range c {
		b.toldSum[i] += sign * c[i]
	}
}

// dueTold drops the told requests due by now: they have come back (and
// queued, or been told again) or gone.
func (b *budgets) dueTold(now int64) {
	i := 0
	for ; i < len(b.told) && b.told[i].at <= now; i++ {
		b.addTold(b.told[i].c, -1)
	}
	if i > 0 {
		b.told = append(b.told[:0], b.told[i:]...)
	}
}

// maxTold bounds the refused requests a budget spreads.
const maxTold = 4096

// toldBudgets bounds the returns told that a refusal counts ahead of it to
// this many budgets' worth (minutes of refill): a caller that asks again
// without waiting books a return each time, and would push every other
// caller's return back by a minute per budget it asked for.
const toldBudgets = 8

// toldBound is the sum of the returns told for part i, scaled as waiting
// scales estimates, at most toldBudgets of its limit.
func (b *budgets) toldBound(i int) int64 {
	t := int64(float64(b.toldSum[i]) * b.ratio(i))
	if l := b.w[i].limit; l > 0 {
		return min(t, toldBudgets*l)
	}
	return t
}
