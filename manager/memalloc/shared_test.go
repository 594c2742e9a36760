package memalloc_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

func TestChangedClosesWhenAUnitTurnsReady(t *testing.T) {
	s := memalloc.NewShared()
	ch := s.Changed(manager.DefaultTemplate)
	if ch != s.Changed(manager.DefaultTemplate) {
		t.Fatal("two channels for one generation")
	}
	select {
	case <-ch:
		t.Fatal("closed before any change")
	default:
	}
	if _, err := s.Create(context.Background(), "u1", manager.DefaultTemplate); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("not closed after a unit turned ready")
	}
	if next := s.Changed(manager.DefaultTemplate); next == ch {
		t.Fatal("the closed channel was handed out again")
	}
}

// TestAllocateWaitsForTheNotification: an Allocate on an empty shared pool returns as soon
// as the unit it asked for turns ready, having tried to claim only before waiting and after
// the notification (a polling wait would claim every few milliseconds).
func TestAllocateWaitsForTheNotification(t *testing.T) {
	for _, separate := range []bool{false, true} {
		s := memalloc.NewShared()
		s.Delay = 300 * time.Millisecond
		m, err := manager.New(manager.Options{Allocator: s, Estimator: estimator.Fixed{N: 0}, Clock: manager.RealClock{},
			Initializer: memalloc.Initializer, IsLeader: func() bool { return false }, AllocateWait: time.Minute,
			MissedEventGuard: time.Hour, SeparateClaim: separate}) // only the notification can wake the wait
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(context.Background()) })
		key, _ := client.NewKey()
		if _, err := m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey()}); err != nil {
			t.Fatal(err)
		}
		n, want := 0, "Pick" // the claim is bind's write
		if separate {
			want = "Claim"
		}
		for _, c := range s.Calls() {
			if c.Method == want {
				n++
			}
		}
		if n != 2 {
			t.Errorf("SeparateClaim %v: %d %s calls, want 2 (before waiting and after the notification): the wait polls", separate, n, want)
		}
	}
}
