package managere2e

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/manager/egress"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// An allowlist at the bounds fits the sandbox's init message and is enforced; one past them
// is refused up front, naming the bound, with no unit taken or destroyed.
func TestEgressAllowlistBounds(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)
	before := waitPoolSettled(t, ctx, mc, 1)

	// MaxEntries entries of MaxBytes/MaxEntries bytes each: the longest list allowed.
	allowed := newLoopbackServer(t, "hello")
	full := []string{allowed.hostPort()}
	size := egress.MaxBytes/egress.MaxEntries - 1
	for i := 1; i < egress.MaxEntries; i++ {
		suffix := fmt.Sprintf(".h%d.example:443", i)
		full = append(full, strings.Repeat("abcdefghi.", (size-len(suffix))/10)+"x"+suffix)
	}
	over := append(full[:len(full):len(full)], "one-more.example:443")
	if n := len(strings.Join(full, "")); n > egress.MaxBytes {
		t.Fatalf("the full list has %d bytes", n)
	}

	key := sandboxtest.NewKey(t)
	_, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: over})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("(at most %d)", egress.MaxEntries)) {
		t.Fatalf("Allocate with %d entries = %v, want InvalidArgument naming the bound", len(over), err)
	}
	after := waitPoolSettled(t, ctx, mc, 1)
	for id := range before {
		if _, ok := after[id]; !ok {
			t.Fatalf("unit %s is gone after a refused allocation (before %v, after %v)", id, before, after)
		}
	}

	resp, sb := rawAllocate(t, ctx, mc, key, 0, full...)
	r := curl(t, ctx, sb, "", "", "http://"+allowed.hostPort()+"/")
	if r.code != "200" || r.body != "hello" {
		t.Fatalf("curl to the first entry of a full list: %+v", r)
	}
	if got := list(t, ctx, mc)[resp.GetSandboxId()].GetEgress(); len(got) != len(full) {
		t.Fatalf("the lease lists %d entries, want %d", len(got), len(full))
	}
}
