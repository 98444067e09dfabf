package ilist_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/ilist"
)

func values(l *ilist.List[int]) []int {
	var out []int
	for e := l.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value)
	}
	return out
}

func TestList(t *testing.T) {
	var l ilist.List[int]
	assert.Nil(t, l.Front(), "the zero list is empty")
	es := make([]ilist.Elem[int], 4)
	for i := range es {
		es[i].Value = i
		l.PushBack(&es[i])
	}
	assert.Equal(t, []int{0, 1, 2, 3}, values(&l))
	assert.Equal(t, 4, l.Len())

	assert.True(t, l.Remove(&es[1]), "from the middle")
	assert.True(t, l.Remove(&es[0]), "from the front")
	assert.True(t, l.Remove(&es[3]), "from the back")
	assert.False(t, l.Remove(&es[3]), "twice is a no-op")
	assert.Nil(t, es[3].Next())
	assert.Equal(t, []int{2}, values(&l))

	var other ilist.List[int]
	assert.False(t, other.Remove(&es[2]), "an element of another list is left alone")
	assert.Equal(t, 1, l.Len())

	l.PushBack(&es[0]) // an element can be linked again once removed
	assert.Equal(t, []int{2, 0}, values(&l))
	l.Remove(&es[2])
	l.Remove(&es[0])
	assert.Nil(t, l.Front())
	assert.Equal(t, 0, l.Len())
}
