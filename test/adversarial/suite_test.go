package adversarial

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// Limits of the suite's sandboxes: smaller than the default template's, so that filling the
// memory, the workspace or /tmp takes seconds.
var limits = runscalloc.Limits{MemoryBytes: 512 << 20, WorkspaceBytes: 128 << 20}

const poolSize = 2

// TestAdversarial runs the attack groups one after the other against one manager. Run one
// group alone with -run TestAdversarial/<group>.
func TestAdversarial(t *testing.T) {
	s := startSuite(t)
	for _, g := range []struct {
		name string
		run  func(*testing.T, *suite)
	}{
		{"kernel", kernelAttacks},
		{"network", networkAttacks},
		{"trust", trustAttacks},
		{"files", fileAttacks},
		{"lease", leaseAttacks},
		{"requests", requestAttacks},
		{"host users", hostUserAttacks},
		{"resources", resourceAttacks},
	} {
		t.Run(g.name, func(t *testing.T) { g.run(t, s) })
	}
}

// suite is the manager every group attacks, and a bystander: a sandbox bound to another agent
// that no attack targets, checked after every attack that is contained rather than refused.
type suite struct {
	m         *sandboxtest.Manager
	mc        managerv1.ManagerClient
	bystander *lease
}

// bystanderFile is a file of the bystander's workspace, with its content.
const bystanderFile, bystanderData = "bystander.txt", "the bystander's data\n"

func startSuite(t *testing.T) *suite {
	m := sandboxtest.StartManager(t, sandboxtest.ManagerOptions{PoolSize: poolSize, LeaseTTL: 30 * time.Minute, Limits: limits})
	conn, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &suite{m: m, mc: managerv1.NewManagerClient(conn)}
	ctx := testenv.Context(t, 2*time.Minute)
	s.bystander = s.allocate(t, ctx)
	if err := s.bystander.C.WriteFile(ctx, bystanderFile, []byte(bystanderData), 0o644); err != nil {
		t.Fatalf("writing the bystander's file: %v", err)
	}
	return s
}

// lease is a sandbox the suite allocated through the raw API (no background renewal), and the
// agent's connection to it.
type lease struct {
	ID, Token, Endpoint string
	Key                 *client.Key
	SandboxKey          []byte
	C                   *client.Sandbox
}

// allocate allocates a sandbox with the egress allowlist egress and connects to it. A cleanup
// releases it when t ends (unless an attack already did).
func (s *suite) allocate(t *testing.T, ctx context.Context, egress ...string) *lease {
	t.Helper()
	key := sandboxtest.NewKey(t)
	resp, err := s.mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: egress})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	l := &lease{ID: resp.GetSandboxId(), Token: resp.GetLeaseToken(), Endpoint: resp.GetEndpoint(), Key: key,
		SandboxKey: resp.GetSandboxPublicKey()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := s.mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: l.ID, LeaseToken: l.Token})
		if c := status.Code(err); c != codes.OK && c != codes.NotFound && c != codes.FailedPrecondition {
			t.Errorf("releasing %s: %v", l.ID, err)
		}
	})
	if l.C, err = client.Dial(l.Endpoint, l.SandboxKey, key); err != nil {
		t.Fatalf("dialing %s: %v", l.Endpoint, err)
	}
	t.Cleanup(func() { l.C.Close() })
	return l
}

// serves returns an error unless l's sandbox answers a file call and a command.
func serves(ctx context.Context, l *lease) error {
	if _, err := l.C.Stat(ctx, ".", false); err != nil {
		return fmt.Errorf("sandbox %s does not answer Stat: %w", l.ID, err)
	}
	res, err := l.C.Exec(ctx, client.Command{Script: "echo alive"})
	if err != nil {
		return fmt.Errorf("sandbox %s does not run a command: %w", l.ID, err)
	}
	if string(res.Stdout) != "alive\n" {
		return fmt.Errorf("sandbox %s: echo alive printed %q (exit %d)", l.ID, res.Stdout, res.ExitCode)
	}
	return nil
}

// unharmed returns an error unless the manager answers, the bystander is bound, serves and
// holds its file unchanged, and each of also serves.
func (s *suite) unharmed(ctx context.Context, also ...*lease) error {
	if _, err := s.mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{}); err != nil {
		return fmt.Errorf("the manager does not answer PoolStatus: %w", err)
	}
	units, err := s.list(ctx)
	if err != nil {
		return err
	}
	if st := units[s.bystander.ID].GetState(); st != managerv1.UnitState_UNIT_STATE_BOUND {
		return fmt.Errorf("the bystander %s is %v", s.bystander.ID, st)
	}
	if err := serves(ctx, s.bystander); err != nil {
		return fmt.Errorf("the bystander: %w", err)
	}
	if b, err := s.bystander.C.ReadFile(ctx, bystanderFile); err != nil || string(b) != bystanderData {
		return fmt.Errorf("the bystander's file: %q, %v", b, err)
	}
	for _, l := range also {
		if err := serves(ctx, l); err != nil {
			return err
		}
	}
	return nil
}

// containedOr judges an attack that ran: contained (with detail) if nothing but the attacked
// sandbox could have been touched, else an escape naming what was harmed.
func (s *suite) containedOr(ctx context.Context, detail string, attacked ...*lease) verdict {
	if err := s.unharmed(ctx, attacked...); err != nil {
		return escapedf("%s; then: %v", detail, err)
	}
	if len(attacked) == 0 {
		return containedf("%s; the manager and the bystander serve on", detail)
	}
	return containedf("%s; the manager, the bystander and the attacked sandbox serve on", detail)
}

func (s *suite) list(ctx context.Context) (map[string]*managerv1.Sandbox, error) {
	resp, err := s.mc.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		return nil, fmt.Errorf("List: %w", err)
	}
	out := map[string]*managerv1.Sandbox{}
	for _, u := range resp.GetSandboxes() {
		out[u.GetSandboxId()] = u
	}
	return out, nil
}

// poolState is what a refused request must leave as it was: the counters of PoolStatus and the
// units with their states.
type poolState struct {
	allocations, creations, destructions, failures int64
	units                                          []string // "id state", sorted
}

func (p poolState) String() string {
	return fmt.Sprintf("allocations %d, creations %d, destructions %d, failures %d, units %q",
		p.allocations, p.creations, p.destructions, p.failures, p.units)
}

// settled waits until the pool holds poolSize ready units and none is being created,
// initialised or destroyed, and returns its state.
func (s *suite) settled(t *testing.T, ctx context.Context) poolState {
	t.Helper()
	var p poolState
	sandboxtest.Eventually(t, 2*time.Minute, "the pool settled", func() (bool, string) {
		var err error
		if p, err = s.poolState(ctx); err != nil {
			return false, err.Error()
		}
		ready, busy := 0, 0
		for _, u := range p.units {
			switch {
			case strings.HasSuffix(u, " UNIT_STATE_READY"):
				ready++
			case strings.HasSuffix(u, "_CREATING"), strings.HasSuffix(u, "_INITIALISING"), strings.HasSuffix(u, "_DESTROYING"):
				busy++
			}
		}
		return ready == poolSize && busy == 0, p.String()
	})
	return p
}

// readyUnit waits for the pool to settle and returns the id of one of its ready units.
func (s *suite) readyUnit(t *testing.T, ctx context.Context) string {
	t.Helper()
	for _, u := range s.settled(t, ctx).units {
		if id, ok := strings.CutSuffix(u, " UNIT_STATE_READY"); ok {
			return id
		}
	}
	t.Fatal("no ready unit in a settled pool")
	return ""
}

func (s *suite) poolState(ctx context.Context) (poolState, error) {
	ps, err := s.mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		return poolState{}, fmt.Errorf("PoolStatus: %w", err)
	}
	units, err := s.list(ctx)
	if err != nil {
		return poolState{}, err
	}
	p := poolState{allocations: int64(ps.GetAllocations()), creations: int64(ps.GetCreations()),
		destructions: int64(ps.GetDestructions()), failures: int64(ps.GetFailures())}
	for id, u := range units {
		p.units = append(p.units, id+" "+u.GetState().String())
	}
	slices.Sort(p.units)
	return p, nil
}

// refusedUnchanged judges a request to the manager that must be refused with code want, its
// message naming mention, leaving the pool as before was.
func (s *suite) refusedUnchanged(ctx context.Context, err error, want codes.Code, mention string, before poolState) verdict {
	if err == nil {
		return escapedf("accepted")
	}
	if got := status.Code(err); got != want || !strings.Contains(status.Convert(err).Message(), mention) {
		return escapedf("refused with %v, want %v naming %q: %.300v", got, want, mention, err)
	}
	after, perr := s.poolState(ctx)
	if perr != nil {
		return escapedf("refused, then: %v", perr)
	}
	if after.String() != before.String() {
		return escapedf("refused (%v), but the pool changed: before %v, after %v", status.Code(err), before, after)
	}
	return refusedf("%v: %.200s; the pool unchanged", status.Code(err), status.Convert(err).Message())
}

// errString is err's text, or "<nil>".
func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

var errServedNothing = errors.New("the server hung up without serving")
