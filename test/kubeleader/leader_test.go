// Package kubeleader tests manager leader election against a real API server.
package kubeleader

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager/leader"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExactlyOneLeaderAndHandover: two replicas elect exactly one leader; when it stops
// (releasing its lease), the other takes over.
func TestExactlyOneLeaderAndHandover(t *testing.T) {
	ns := env.Namespace(t)
	start := func(id string) (*leader.Elector, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		e, err := leader.Start(ctx, leader.Options{Client: env.Client, Namespace: ns, Name: "fusebox-manager",
			Identity: id, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); <-e.Done() })
		return e, cancel
	}
	a, cancelA := start("replica-a")
	b, cancelB := start("replica-b")
	eventually(t, "a leader", func() bool { return a.IsLeader() || b.IsLeader() })
	for range 20 {
		if a.IsLeader() && b.IsLeader() {
			t.Fatal("two leaders at once")
		}
		time.Sleep(50 * time.Millisecond)
	}
	first, second, stop := a, b, cancelA
	if b.IsLeader() {
		first, second, stop = b, a, cancelB
	}
	stop()
	<-first.Done()
	eventually(t, "the other replica to take over", second.IsLeader)
	if first.IsLeader() {
		t.Fatal("the stopped replica still claims leadership")
	}
}

func TestStartRefusesMissingOptions(t *testing.T) {
	if _, err := leader.Start(context.Background(), leader.Options{}); err == nil {
		t.Fatal("Start accepted empty options")
	}
}
