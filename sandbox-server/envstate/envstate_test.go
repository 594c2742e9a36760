package envstate

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestLastLogicalWriteWins(t *testing.T) {
	s := New(map[string]string{"A": "base", "KEEP": "k"}, "/w")
	_, t1, _ := s.Begin("g1", 1)
	_, t2, _ := s.Begin("g1", 2)
	// The later command finishes first; the earlier one must not overwrite it.
	s.Record(t2, Delta{Set: map[string]string{"A": "two"}, Cwd: "/w/two"})
	s.Record(t1, Delta{Set: map[string]string{"A": "one", "B": "one"}, Cwd: "/w/one"})
	// A removal of higher order beats a set of lower order.
	_, t3, _ := s.Begin("g1", 3)
	s.Record(t3, Delta{Unset: []string{"B"}})

	snap, _, _ := s.Begin("g2", 1)
	want := map[string]string{"A": "two", "KEEP": "k"}
	if !maps.Equal(snap.Env, want) || snap.Cwd != "/w/two" {
		t.Fatalf("next base = %v %q, want %v /w/two", snap.Env, snap.Cwd, want)
	}
}

func TestBaseIsCopyOnWrite(t *testing.T) {
	s := New(map[string]string{"A": "1"}, "/w")
	first, tk, _ := s.Begin("g1", 0)
	s.Record(tk, Delta{Set: map[string]string{"A": "2"}})
	second, _, _ := s.Begin("g2", 0)
	if first.Env["A"] != "1" {
		t.Fatalf("the old snapshot was mutated: %v", first.Env)
	}
	if second.Env["A"] != "2" {
		t.Fatalf("the new base lacks the commit: %v", second.Env)
	}
}

func TestLateCommandOfCommittedGroupIsDropped(t *testing.T) {
	s := New(nil, "/w")
	_, late, _ := s.Begin("g1", 5)
	s.Begin("g2", 0)
	if s.Record(late, Delta{Set: map[string]string{"X": "late"}}) {
		t.Fatal("a delta of a committed group was recorded")
	}
	if snap, _, _ := s.Begin("g3", 0); snap.Env["X"] != "" {
		t.Fatalf("late delta leaked into the base: %v", snap.Env)
	}
}

func TestDuplicateOrderRefused(t *testing.T) {
	s := New(nil, "/w")
	if _, _, err := s.Begin("g", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Begin("g", 1); !errors.Is(err, ErrDuplicateOrder) {
		t.Fatalf("err = %v, want ErrDuplicateOrder", err)
	}
	// A new group resets the orders.
	s.Begin("h", 1)
	if _, _, err := s.Begin("g", 1); err != nil {
		t.Fatalf("order reuse after a new group: %v", err)
	}
}

func TestAnonymousCommandsAreSequential(t *testing.T) {
	s := New(nil, "/w")
	_, a, _ := s.Begin("", 0)
	s.Record(a, Delta{Set: map[string]string{"V": "1"}, Cwd: "/w/sub"})
	snap, b, err := s.Begin("", 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Env["V"] != "1" || snap.Cwd != "/w/sub" {
		t.Fatalf("second anonymous command did not see the first's state: %+v", snap)
	}
	s.Record(b, Delta{Unset: []string{"V"}})
	if cur := s.Current(); len(cur.Env) != 0 {
		t.Fatalf("Current = %v", cur.Env)
	}
}

// TestAnyCompletionOrderGivesTheSameState is the property the lazy-commit design promises:
// whatever order N commands finish in (and whatever goroutines record them), the next group's
// base equals applying their deltas in logical order.
func TestAnyCompletionOrderGivesTheSameState(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"A", "B", "C", "D", "E"}
	for trial := range 300 {
		n := 1 + rng.IntN(40)
		deltas := make([]Delta, n)
		for i := range deltas {
			d := Delta{Set: map[string]string{}}
			for _, k := range keys {
				switch rng.IntN(4) {
				case 0:
					d.Set[k] = fmt.Sprintf("%s%d", k, i)
				case 1:
					d.Unset = append(d.Unset, k)
				}
			}
			if rng.IntN(3) == 0 {
				d.Cwd = fmt.Sprintf("/w/%d", i)
			}
			deltas[i] = d
		}
		base := map[string]string{"A": "a0", "C": "c0", "Z": "z0"}

		// Expected: apply in logical order, one after another.
		want := maps.Clone(base)
		wantCwd := "/w"
		for _, d := range deltas {
			for k, v := range d.Set {
				want[k] = v
			}
			for _, k := range d.Unset {
				delete(want, k)
			}
			if d.Cwd != "" {
				wantCwd = d.Cwd
			}
		}

		s := New(base, "/w")
		tickets := make([]Ticket, n)
		for i := range n {
			_, tk, err := s.Begin("g", uint64(i))
			if err != nil {
				t.Fatal(err)
			}
			tickets[i] = tk
		}
		perm := rng.Perm(n)
		var wg sync.WaitGroup
		for _, i := range perm {
			wg.Go(func() { s.Record(tickets[i], deltas[i]) })
		}
		wg.Wait()
		got, _, _ := s.Begin("next", 0)
		if !maps.Equal(got.Env, want) || got.Cwd != wantCwd {
			t.Fatalf("trial %d (n=%d, order %v): got %v %q, want %v %q", trial, n, perm, got.Env, got.Cwd, want, wantCwd)
		}
	}
}

func TestDiff(t *testing.T) {
	d := Diff(map[string]string{"A": "1", "B": "2", "SKIP": "x"}, map[string]string{"A": "1", "B": "3", "C": "4"},
		func(k string) bool { return k == "SKIP" })
	if !maps.Equal(d.Set, map[string]string{"B": "3", "C": "4"}) || len(d.Unset) != 0 {
		t.Fatalf("Diff = %+v", d)
	}
	d = Diff(map[string]string{"A": "1"}, map[string]string{}, func(string) bool { return false })
	if len(d.Unset) != 1 || d.Unset[0] != "A" {
		t.Fatalf("Diff removal = %+v", d)
	}
}

// AddBase adds only the variables the base lacks, and leaves snapshots already taken as they
// were.
func TestAddBaseKeepsExistingVariables(t *testing.T) {
	s := New(map[string]string{"PATH": "/bin", "HTTP_PROXY": "explicit"}, "/w")
	before := s.Current()
	s.AddBase(map[string]string{"HTTP_PROXY": "relay", "HTTPS_PROXY": "relay"})
	got := s.Current().Env
	if got["PATH"] != "/bin" || got["HTTP_PROXY"] != "explicit" || got["HTTPS_PROXY"] != "relay" || len(got) != 3 {
		t.Errorf("after AddBase: %v", got)
	}
	if _, ok := before.Env["HTTPS_PROXY"]; ok || len(before.Env) != 2 {
		t.Errorf("a snapshot taken before AddBase changed: %v", before.Env)
	}
}

// TestOverride: an allocation's env wins over the base's (proxy variables included), and its
// working directory replaces the base's, a relative one under it.
func TestOverride(t *testing.T) {
	s := New(map[string]string{"A": "1", "B": "1"}, "/workspace")
	s.AddBase(map[string]string{"HTTP_PROXY": "http://127.0.0.1:3128"})
	s.Override(map[string]string{"B": "2", "HTTP_PROXY": ""}, "src")
	got := s.Current()
	if got.Cwd != "/workspace/src" || got.Env["A"] != "1" || got.Env["B"] != "2" || got.Env["HTTP_PROXY"] != "" {
		t.Errorf("after Override: %+v", got)
	}
	s.Override(nil, "/srv")
	if got := s.Current(); got.Cwd != "/srv" || got.Env["B"] != "2" {
		t.Errorf("after an absolute Override: %+v", got)
	}
	s.Override(nil, "")
	if got := s.Current(); got.Cwd != "/srv" {
		t.Errorf("an empty cwd changed the directory to %q", got.Cwd)
	}
}
