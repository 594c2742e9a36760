package manager

import (
	"fmt"
	"testing"
	"time"
)

type stoppedClock struct{ t time.Time }

func (c stoppedClock) Now() time.Time { return c.t }

// Failed units beyond maxFailedKept are forgotten oldest first, except those whose remains are
// still to be destroyed: forgetting one would leak what it holds.
func TestFailedUnitsWithRemainsAreKept(t *testing.T) {
	s := NewStateOperator(stoppedClock{time.Unix(1000, 0)})
	fail := func(i int, remains bool) string {
		id := fmt.Sprintf("u%03d", i)
		if err := s.Insert(UnitInfo{ID: id, Template: DefaultTemplate}, Creating, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Transition(id, Creating, Failed, func(u *Unit) { u.Remains = remains }); err != nil {
			t.Fatal(err)
		}
		return id
	}
	kept := []string{fail(0, true), fail(1, true)}
	for i := 2; i < maxFailedKept+20; i++ {
		fail(i, false)
	}
	for _, id := range kept {
		if u, ok := s.Get(id); !ok || !u.Remains {
			t.Errorf("%s with remains was forgotten", id)
		}
	}
	if _, ok := s.Get("u002"); ok {
		t.Error("the oldest failed unit without remains is still kept")
	}
	if n := s.Counts("")[Failed]; n != maxFailedKept {
		t.Errorf("%d failed units kept, want %d", n, maxFailedKept)
	}
	if due := s.RemainsDue(time.Unix(1000, 0), 0); len(due) != 2 {
		t.Errorf("remains due %v, want the two", due)
	}
	if due := s.RemainsDue(time.Unix(1000, 0), time.Second); len(due) != 0 {
		t.Errorf("remains due before their time: %v", due)
	}
}
