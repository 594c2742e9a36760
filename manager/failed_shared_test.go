package manager_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
)

// TestSharedPoolFailedUnit: a bound unit the shared allocator reports failed
// (AnnotationFailed, as the kube allocator does for a pod whose server ended) is listed failed
// with the reason by every replica, still its owner's; its renewal is refused naming the
// reason (a wrong token is refused first); it no longer counts as bound; and the leader
// destroys it once its lease ends.
func TestSharedPoolFailedUnit(t *testing.T) {
	a, c, ms := replicas(t, 1)
	eventually(t, "pool", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 1 })
	ctx := context.Background()
	key, _ := client.NewKey()
	al, err := ms[1].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Minute, Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := a.Lookup(ctx, al.ID)
	if err != nil {
		t.Fatal(err)
	}
	ann := maps.Clone(info.Annotations)
	ann[manager.AnnotationFailed] = "sandbox server exited: exit code 137 (Error)"
	if err := a.Annotate(ctx, al.ID, ann); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		units := m.List()
		j := slices.IndexFunc(units, func(u manager.Unit) bool { return u.Info.ID == al.ID })
		if j < 0 {
			t.Fatalf("replica %d does not list %s", i, al.ID)
		}
		u := units[j]
		if u.State != manager.Failed || u.Err != "exited: sandbox server exited: exit code 137 (Error)" || u.Lease == nil || u.Lease.Owner != "alice" {
			t.Fatalf("replica %d lists %s as %s %q (lease %+v), want failed with the reason, alice's", i, al.ID, u.State, u.Err, u.Lease)
		}
		if st := m.Status(); st.Units["failed"] != 1 || st.Units["bound"] != 0 {
			t.Errorf("replica %d: units %v, want one failed and none bound", i, st.Units)
		}
	}
	if _, err := ms[0].Renew(ctx, al.ID, "wrong", 0); !errors.Is(err, manager.ErrBadLeaseToken) {
		t.Fatalf("Renew with a wrong token = %v, want ErrBadLeaseToken", err)
	}
	_, err = ms[0].Renew(ctx, al.ID, al.LeaseToken, 0)
	if !errors.Is(err, manager.ErrLeaseEnded) || !strings.Contains(err.Error(), "exit code 137") {
		t.Fatalf("Renew = %v, want ErrLeaseEnded naming the exit", err)
	}
	c.Step(2 * time.Minute)
	eventually(t, "failed unit destroyed by the leader at its lease's end", func() bool { return !slices.Contains(a.Units(), al.ID) })
}
