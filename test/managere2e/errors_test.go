package managere2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// Bad requests to the real gRPC server get the documented codes, consume no sandbox and
// leave the bound one alone.
func TestBadRequests(t *testing.T) {
	e := newEnv(t)
	m := e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	mc := dialManager(t, e.Addr)

	good := sandboxtest.NewKey(t)
	bound, sb := rawAllocate(t, ctx, mc, good, 10*time.Minute)
	id, token := bound.GetSandboxId(), bound.GetLeaseToken()
	waitPoolSettled(t, ctx, mc, 1)
	containers, dirs := e.containers(t), e.sandboxDirs(t)
	if len(containers) != 2 || !slices.Equal(containers, dirs) {
		t.Fatalf("before the refusals: containers %v, sandbox directories %v; want the bound unit and one ready", containers, dirs)
	}
	psBefore, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	allocs := []struct {
		name    string
		req     *managerv1.AllocateRequest
		mention string // a part of the message that tells the caller what was wrong
	}{
		{"no public key", &managerv1.AllocateRequest{}, "public key"},
		{"garbage public key", &managerv1.AllocateRequest{AgentPublicKey: []byte("not a DER public key")}, "public key"},
		{"unknown template", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Template: "no-such-template"}, "no-such-template"},
		{"egress URL", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Egress: []string{"http://x/"}}, `"http://x/"`},
		{"egress without port", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Egress: []string{"x.com"}}, `"x.com"`},
		{"egress bare wildcard", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Egress: []string{"*:443"}}, `"*:443"`},
		{"egress one bad among good", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Egress: []string{"127.0.0.1:80", "*:443"}}, `"*:443"`},
		{"negative lease", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), LeaseTtl: durationpb.New(-time.Second)}, "lease"},
		{"bad label name", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), Labels: map[string]string{"a=b": "x"}}, "label"},
		{"malformed lease", &managerv1.AllocateRequest{AgentPublicKey: good.PublicKey(), LeaseTtl: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "duration"},
	}
	for _, tc := range allocs {
		t.Run("Allocate/"+tc.name, func(t *testing.T) {
			resp, err := mc.Allocate(ctx, tc.req)
			wantCode(t, "Allocate", err, codes.InvalidArgument)
			if resp != nil {
				t.Errorf("got a sandbox: %v", resp)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
		})
	}

	leases := []struct {
		name      string
		id, token string
		want      codes.Code
	}{
		{"wrong token", id, "not-the-token", codes.PermissionDenied},
		{"empty token", id, "", codes.PermissionDenied},
		{"another lease's token shape", id, strings.Repeat("A", len(token)), codes.PermissionDenied},
		{"unknown sandbox", "fbx-000000000000", token, codes.NotFound},
		{"path-like id", "../../etc", token, codes.NotFound},
		{"empty id", "", token, codes.NotFound},
	}
	for _, tc := range leases {
		t.Run("Renew/"+tc.name, func(t *testing.T) {
			_, err := mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: tc.id, LeaseToken: tc.token})
			wantCode(t, "Renew", err, tc.want)
		})
		t.Run("Release/"+tc.name, func(t *testing.T) {
			_, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: tc.id, LeaseToken: tc.token})
			wantCode(t, "Release", err, tc.want)
		})
	}
	_, err = mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: token, LeaseTtl: durationpb.New(-time.Second)})
	wantCode(t, "Renew with a negative TTL", err, codes.InvalidArgument)

	// Nothing was created, consumed or destroyed by the refusals.
	if got := e.containers(t); !slices.Equal(got, containers) {
		t.Errorf("containers after the refusals %v, before %v", got, containers)
	}
	if got := e.sandboxDirs(t); !slices.Equal(got, dirs) {
		t.Errorf("sandbox directories after the refusals %v, before %v", got, dirs)
	}
	ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetAllocations() != psBefore.GetAllocations() || ps.GetCreations() != psBefore.GetCreations() ||
		ps.GetDestructions() != psBefore.GetDestructions() || ps.GetFailures() != psBefore.GetFailures() {
		t.Errorf("PoolStatus changed across the refusals: before %v, after %v", psBefore, ps)
	}
	if s := list(t, ctx, mc)[id]; s.GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
		t.Errorf("the bound unit after the refusals: %v", s)
	}

	// The lease token is a secret: List does not show it and the manager does not log it.
	lr, err := mc.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(prototext.Format(lr), token) {
		t.Errorf("List shows the lease token")
	}
	if strings.Contains(m.Log.String(), token) {
		t.Errorf("the manager logged the lease token")
	}

	// The lease still belongs to its owner, and the sandbox still answers.
	if out := sandboxtest.Sh(t, ctx, sb, "echo still here"); out != "still here\n" {
		t.Errorf("exec after the refusals: %q", out)
	}
	if _, err := mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: token}); err != nil {
		t.Errorf("Renew with the right token: %v", err)
	}
	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: id, LeaseToken: token}); err != nil {
		t.Fatalf("Release with the right token: %v", err)
	}
	e.waitUnitGone(t, id)
	// Released: the token no longer renews or releases anything. A destroyed unit is
	// forgotten, so NotFound; FailedPrecondition ("released") would be right too.
	_, err = mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: token})
	wantCode(t, "Renew after release", err, codes.NotFound, codes.FailedPrecondition)
	_, err = mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: id, LeaseToken: token})
	wantCode(t, "Release after release", err, codes.NotFound, codes.FailedPrecondition)
}
