// Package ilist is an intrusive doubly linked list: the element lives inside
// the value it links, so linking and unlinking allocate nothing.
//
// It is container/list without the allocation per element and without the
// interface boxing. A List must be used under its owner's lock.
package ilist

// Elem links one value into at most one List at a time.
type Elem[T any] struct {
	Value      T
	prev, next *Elem[T]
	list       *List[T]
}

// Next returns the element after e, or nil at the end.
func (e *Elem[T]) Next() *Elem[T] {
	if n := e.next; e.list != nil && n != &e.list.root {
		return n
	}
	return nil
}

// List is a doubly linked list of Elems. The zero value is an empty list.
type List[T any] struct {
	root Elem[T] // sentinel; root.next is the front
	n    int
}

func (l *List[T]) lazyInit() {
	if l.root.next == nil {
		l.root.next = &l.root
		l.root.prev = &l.root
	}
}

// Len returns the number of linked elements.
func (l *List[T]) Len() int { return l.n }

// Front returns the first element, or nil.
func (l *List[T]) Front() *Elem[T] {
	if l.n == 0 {
		return nil
	}
	return l.root.next
}

// PushBack links e at the back. e must not be in a list.
func (l *List[T]) PushBack(e *Elem[T]) {
	l.lazyInit()
	at := l.root.prev
	e.prev = at
	e.next = &l.root
	at.next = e
	l.root.prev = e
	e.list = l
	l.n++
}

// Remove unlinks e if it is in l and reports whether it was.
func (l *List[T]) Remove(e *Elem[T]) bool {
	if e.list != l {
		return false
	}
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next, e.list = nil, nil, nil
	l.n--
	return true
}
