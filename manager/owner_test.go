package manager_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// asCaller is the Service called by one identity (as the auth interceptors would set it).
type asCaller struct {
	s  *manager.Service
	id auth.Identity
}

// rootService is the Service called by the local root user, an operator.
func rootService(m *manager.Manager) *asCaller {
	return &asCaller{s: &manager.Service{M: m}, id: auth.LocalIdentity(0, true)}
}

func (c *asCaller) ctx(ctx context.Context) context.Context { return auth.NewContext(ctx, c.id) }

func (c *asCaller) Allocate(ctx context.Context, r *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	return c.s.Allocate(c.ctx(ctx), r)
}

func (c *asCaller) Renew(ctx context.Context, r *managerv1.RenewRequest) (*managerv1.RenewResponse, error) {
	return c.s.Renew(c.ctx(ctx), r)
}

func (c *asCaller) Release(ctx context.Context, r *managerv1.ReleaseRequest) (*managerv1.ReleaseResponse, error) {
	return c.s.Release(c.ctx(ctx), r)
}

func (c *asCaller) List(ctx context.Context, r *managerv1.ListRequest) (*managerv1.ListResponse, error) {
	return c.s.List(c.ctx(ctx), r)
}

func (c *asCaller) PoolStatus(ctx context.Context, r *managerv1.PoolStatusRequest) (*managerv1.PoolStatusResponse, error) {
	return c.s.PoolStatus(c.ctx(ctx), r)
}

func ids(l *managerv1.ListResponse) []string {
	var out []string
	for _, s := range l.GetSandboxes() {
		out = append(out, s.SandboxId)
	}
	slices.Sort(out)
	return out
}

const testPolicy = `
rules:
- namespaces: [agents]
  templates: [default]
  egress: ["pypi.org:443"]
operators: [fusebox/ops]
`

func TestListShowsTheCallerItsOwnSandboxes(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.start(t)
	p, err := auth.ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	svc := &manager.Service{M: e.m, Policy: p}
	as := func(id auth.Identity) *asCaller { return &asCaller{s: svc, id: id} }
	alice, bob := as(auth.LocalIdentity(1000, false)), as(auth.LocalIdentity(1001, false))
	coder, other := as(auth.ServiceAccountIdentity("agents", "coder")), as(auth.ServiceAccountIdentity("agents", "other"))
	ops, root := as(auth.ServiceAccountIdentity("fusebox", "ops")), as(auth.LocalIdentity(0, true))
	ops.id.Operator = true // as the Authenticator marks Policy.Operators
	ctx := context.Background()
	alloc := func(c *asCaller) string {
		t.Helper()
		eventually(t, "ready", func() bool { return e.ready() >= 1 })
		r, err := c.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key, Labels: map[string]string{"who": c.id.Owner[:3]}})
		if err != nil {
			t.Fatal(err)
		}
		return r.SandboxId
	}
	a1, a2, b1, c1 := alloc(alice), alloc(alice), alloc(bob), alloc(coder)
	list := func(c *asCaller) []string {
		t.Helper()
		l, err := c.List(ctx, &managerv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return ids(l)
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	if got := list(alice); !slices.Equal(got, sorted(a1, a2)) {
		t.Errorf("alice sees %v, want %v", got, sorted(a1, a2))
	}
	if got := list(bob); !slices.Equal(got, []string{b1}) {
		t.Errorf("bob sees %v", got)
	}
	if got := list(coder); !slices.Equal(got, []string{c1}) {
		t.Errorf("agents/coder sees %v", got)
	}
	if got := list(other); len(got) != 0 {
		t.Errorf("agents/other sees %v", got)
	}
	eventually(t, "pool refilled", func() bool { return e.ready() >= 1 })
	for _, op := range []*asCaller{root, ops} {
		got := list(op)
		for _, id := range []string{a1, a2, b1, c1} {
			if !slices.Contains(got, id) {
				t.Errorf("operator %s does not see %s: %v", op.id, id, got)
			}
		}
		if len(got) <= 4 {
			t.Errorf("operator %s does not see the warm pool: %v", op.id, got)
		}
	}
	// PoolStatus: a tenant sees its own sandboxes' states and nothing of the pool.
	for c, want := range map[*asCaller]int32{alice: 2, coder: 1, other: 0} {
		ps, err := c.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ps.Units) > 1 || ps.Units["bound"] != want || ps.Allocations != 0 || ps.Creations != 0 || ps.Target != 0 {
			t.Errorf("%s's PoolStatus: %v, want its %d bound sandboxes only", c.id, ps, want)
		}
	}
	for _, op := range []*asCaller{root, ops} {
		ps, err := op.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if ps.Units["bound"] != 4 || ps.Allocations != 4 {
			t.Errorf("operator %s's PoolStatus: %v, want the pool's (4 bound, 4 allocations)", op.id, ps)
		}
	}
	// Release still needs the lease token, whoever calls: bob cannot release alice's
	// sandbox without it, and an operator cannot either.
	for _, c := range []*asCaller{bob, root} {
		if _, err := c.Release(ctx, &managerv1.ReleaseRequest{SandboxId: a1, LeaseToken: "guess"}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s releasing another's sandbox with a wrong token: %v", c.id, err)
		}
		if _, err := c.Renew(ctx, &managerv1.RenewRequest{SandboxId: a1, LeaseToken: "guess"}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s renewing another's sandbox with a wrong token: %v", c.id, err)
		}
	}
}

func TestAllocateHoldsServiceAccountsToThePolicy(t *testing.T) {
	e := newEnv(t, 1, func(o *manager.Options) { o.Templates = []string{"default", "big"}; o.PoolTemplate = "default" })
	e.start(t)
	p, _ := auth.ParsePolicy([]byte(testPolicy))
	svc := &manager.Service{M: e.m, Policy: p}
	ctx := context.Background()
	eventually(t, "ready", func() bool { return e.ready() == 1 })
	tests := []struct {
		name   string
		id     auth.Identity
		req    *managerv1.AllocateRequest
		code   codes.Code
		msg    string
		policy *auth.Policy
	}{
		{"outside the ceiling", auth.ServiceAccountIdentity("agents", "coder"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"pypi.org:443", "evil.example:443"}},
			codes.PermissionDenied, "egress destination evil.example:443 is outside the ceiling of service account agents/coder", p},
		{"template not allowed", auth.ServiceAccountIdentity("agents", "coder"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key, Template: "big"}, codes.PermissionDenied, `may not use template "big"`, p},
		{"outside the policy", auth.ServiceAccountIdentity("elsewhere", "x"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key}, codes.PermissionDenied, "service account elsewhere/x may not allocate sandboxes", p},
		{"no policy", auth.ServiceAccountIdentity("agents", "coder"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key}, codes.PermissionDenied, "may not allocate", nil},
		// The caller is judged before its allowlist is parsed, the list's size before both.
		{"outside the policy, a malformed list", auth.ServiceAccountIdentity("elsewhere", "x"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"not an entry"}}, codes.PermissionDenied, "service account elsewhere/x may not allocate sandboxes", p},
		{"a list over the bound", auth.ServiceAccountIdentity("agents", "coder"),
			&managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: slices.Repeat([]string{"pypi.org:443"}, egress.MaxEntries+1)},
			codes.InvalidArgument, fmt.Sprintf("%d entries (at most %d)", egress.MaxEntries+1, egress.MaxEntries), p},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc.Policy = tt.policy
			_, err := (&asCaller{s: svc, id: tt.id}).Allocate(ctx, tt.req)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("Allocate = %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}
	// Refusals spend no unit.
	if st := e.m.Status(); st.Allocations != 0 || st.Destructions != 0 {
		t.Fatalf("%d allocations and %d destructions after refusals", st.Allocations, st.Destructions)
	}
	svc.Policy = p
	r, err := (&asCaller{s: svc, id: auth.ServiceAccountIdentity("agents", "coder")}).Allocate(ctx,
		&managerv1.AllocateRequest{AgentPublicKey: e.key, Egress: []string{"pypi.org:443"}})
	if err != nil {
		t.Fatalf("inside the ceiling: %v", err)
	}
	if u, _ := e.m.States().Get(r.SandboxId); u.Lease == nil || u.Lease.Owner != "system:serviceaccount:agents:coder" {
		t.Fatalf("owner not recorded: %+v", u.Lease)
	}
}

func TestServiceRefusesCallsWithoutIdentity(t *testing.T) {
	e := newEnv(t, 0, nil)
	svc := &manager.Service{M: e.m}
	if _, err := svc.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: e.key}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Allocate without identity: %v", err)
	}
	if _, err := svc.List(context.Background(), &managerv1.ListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("List without identity: %v", err)
	}
}

// TestOwnerSurvivesAdoption: the owner is stored with the lease, so a restarted manager
// shows an adopted sandbox to its owner only.
func TestOwnerSurvivesAdoption(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.start(t)
	ctx := context.Background()
	eventually(t, "ready", func() bool { return e.ready() == 1 })
	a, err := e.m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, LeaseTTL: time.Hour, Owner: "uid:1000"})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := manager.New(manager.Options{Allocator: e.alloc, Estimator: estimator.Fixed{N: 0}, Clock: e.clock, Initializer: memalloc.Initializer})
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m2.Close(ctx)
	svc := &manager.Service{M: m2}
	for _, tt := range []struct {
		id   auth.Identity
		want []string
	}{
		{auth.LocalIdentity(1000, false), []string{a.ID}},
		{auth.LocalIdentity(1001, false), nil},
	} {
		l, err := svc.List(auth.NewContext(ctx, tt.id), &managerv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(l); !slices.Equal(got, tt.want) {
			t.Errorf("%s sees %v after a restart, want %v", tt.id, got, tt.want)
		}
	}
}

func TestSharedPoolListShowsTheCallerItsOwn(t *testing.T) {
	a, _, ms := replicas(t, 3)
	eventually(t, "shared pool filled", func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 3 })
	e := newEnv(t, 0, nil)
	ctx := context.Background()
	mine, err := ms[0].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, Owner: "system:serviceaccount:agents:coder"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms[1].Allocate(ctx, manager.AllocateRequest{AgentPublicKey: e.key, Owner: "system:serviceaccount:agents:other"}); err != nil {
		t.Fatal(err)
	}
	// Through the other replica, which reads the owner from the unit's annotations.
	l, err := (&manager.Service{M: ms[1]}).List(auth.NewContext(ctx, auth.ServiceAccountIdentity("agents", "coder")), &managerv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(l); !slices.Equal(got, []string{mine.ID}) {
		t.Fatalf("agents/coder sees %v through the other replica, want [%s]", got, mine.ID)
	}
}

// uidHelperEnv names the socket a TestUIDHelper child calls.
const uidHelperEnv = "FUSEBOX_UID_HELPER_SOCK"

// TestUIDHelper is not a test: run as a child process under another user by
// TestUnixSocketCallersSeeTheirOwnSandboxes, it allocates once through the socket and prints
// its sandbox's id and the ids List shows it.
func TestUIDHelper(t *testing.T) {
	sock := os.Getenv(uidHelperEnv)
	if sock == "" {
		t.Skip("a helper process, not a test")
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := managerv1.NewManagerClient(conn)
	k, _ := client.NewKey()
	r, err := c.Allocate(context.Background(), &managerv1.AllocateRequest{AgentPublicKey: k.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.List(context.Background(), &managerv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HELPER %s %s\n", r.SandboxId, strings.Join(ids(l), ","))
}

// TestUnixSocketCallersSeeTheirOwnSandboxes: over the real socket, with the callers' user ids
// from SO_PEERCRED, a process of another user sees only the sandbox it allocated; root sees
// every one.
func TestUnixSocketCallersSeeTheirOwnSandboxes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a client as another user")
	}
	e := newEnv(t, 2, nil)
	e.start(t)
	dir := t.TempDir()
	// The other user must reach the binary and the socket: t.TempDir's parent is 0700 too.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	// The test binary, where the other user can run it.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "manager.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(sock, 0o666) // as --listen-group would share it
	authn := auth.NewAuthenticator(auth.AuthenticatorOptions{})
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(auth.PeerCredentials())}, authn.ServerOptions()...)...)
	managerv1.RegisterManagerServer(srv, &manager.Service{M: e.m})
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := managerv1.NewManagerClient(conn)
	ctx := context.Background()
	eventually(t, "ready", func() bool { return e.ready() >= 1 })
	mine, err := c.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", func() bool { return e.ready() >= 1 })
	cmd := exec.Command(bin, "-test.run=^TestUIDHelper$", "-test.v")
	cmd.Env = append(os.Environ(), uidHelperEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	var theirs, seen string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "HELPER" {
			theirs = f[1]
			if len(f) > 2 {
				seen = f[2]
			}
		}
	}
	if theirs == "" || seen != theirs {
		t.Fatalf("uid 65534 allocated %q and sees %q, want only its own\n%s", theirs, seen, out)
	}
	u, _ := e.m.States().Get(theirs)
	if u.Lease == nil || u.Lease.Owner != "uid:65534" {
		t.Fatalf("owner of %s: %+v", theirs, u.Lease)
	}
	l, err := c.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(l); !slices.Contains(got, theirs) || !slices.Contains(got, mine.SandboxId) {
		t.Fatalf("root sees %v, want both %s and %s", got, mine.SandboxId, theirs)
	}
}
