package memalloc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

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
// the notification (a polling wait would claim again while the creation takes its time).
// Time passes on the manager's fake clock while the creation is held, not on the system's.
func TestAllocateWaitsForTheNotification(t *testing.T) {
	s := memalloc.NewShared()
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	s.Fail = func(method, id string) error {
		if method == "Create" {
			<-hold
		}
		return nil
	}
	c := testingclock.NewFakeClock(time.Unix(0, 0))
	m, err := manager.New(manager.Options{Allocator: s, Estimator: estimator.Fixed{N: 0}, Clock: c,
		Initializer: memalloc.Initializer, IsLeader: func() bool { return false }, AllocateWait: time.Minute,
		MissedEventGuard: time.Hour}) // only the notification can wake the wait
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	t.Cleanup(release) // before Close, which waits for the creation
	key, _ := client.NewKey()
	done := make(chan error, 1)
	go func() {
		_, err := m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
		done <- err
	}()
	count := func(method string) int {
		n := 0
		for _, c := range s.Calls() {
			if c.Method == method {
				n++
			}
		}
		return n
	}
	// The Allocate found no unit and asked for one; 30 s pass on its clock (short of its
	// deadline and of the guard) while the creation is held, then the unit turns ready.
	for deadline := time.Now().Add(10 * time.Second); count("Create") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiting Allocate started no creation")
		}
	}
	for range 30 {
		c.Step(time.Second)
		time.Sleep(time.Millisecond) // lets a polling wait, if there were one, claim
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Allocate still waits after its unit turned ready")
	}
	if n := count("Claim"); n != 2 {
		t.Errorf("%d claims, want 2 (before waiting and after the notification): the wait polls", n)
	}
}
