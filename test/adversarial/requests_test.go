package adversarial

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/egress"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// requestAttacks send the manager allocation requests past its bounds: huge egress lists,
// labels, keys and templates. Each must be refused naming the bound, with no unit taken,
// created or destroyed.
func requestAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "requests")
	ctx := g.ctx
	key := sandboxtest.NewKey(t).PublicKey()

	ports := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("127.%d.%d.%d:80", i>>16&255, i>>8&255, i&255)
		}
		return out
	}
	labels := func(n, valueBytes int) map[string]string {
		out := map[string]string{}
		for i := range n {
			out[fmt.Sprintf("l%d", i)] = strings.Repeat("v", valueBytes)
		}
		return out
	}
	for _, tc := range []struct {
		name, tried string
		req         *managerv1.AllocateRequest
		want        codes.Code
		mention     string
	}{
		{"egress one entry over the bound", fmt.Sprintf("%d egress entries", egress.MaxEntries+1),
			&managerv1.AllocateRequest{Egress: ports(egress.MaxEntries + 1)}, codes.InvalidArgument, fmt.Sprintf("(at most %d)", egress.MaxEntries)},
		{"egress 150,000 entries", "150,000 egress entries (2.7 MB)",
			&managerv1.AllocateRequest{Egress: ports(150_000)}, codes.InvalidArgument, fmt.Sprintf("(at most %d)", egress.MaxEntries)},
		{"egress bytes over the bound", fmt.Sprintf("%d entries of %d bytes", egress.MaxEntries/2, 2*egress.MaxBytes/egress.MaxEntries+8),
			&managerv1.AllocateRequest{Egress: longEntries(egress.MaxEntries/2, 2*egress.MaxBytes/egress.MaxEntries+8)}, codes.InvalidArgument, fmt.Sprintf("(at most %d)", egress.MaxBytes)},
		{"one egress entry of 1 MiB", "a single egress entry of 1 MiB",
			&managerv1.AllocateRequest{Egress: longEntries(1, 1<<20)}, codes.InvalidArgument, fmt.Sprintf("(at most %d)", egress.MaxBytes)},
		{"too many labels", fmt.Sprintf("%d labels", manager.MaxLabels+1),
			&managerv1.AllocateRequest{Labels: labels(manager.MaxLabels+1, 1)}, codes.InvalidArgument, fmt.Sprintf("at most %d", manager.MaxLabels)},
		{"a label value over the bound", fmt.Sprintf("a label value of %d bytes", manager.MaxLabelValueBytes+1),
			&managerv1.AllocateRequest{Labels: labels(1, manager.MaxLabelValueBytes+1)}, codes.InvalidArgument, fmt.Sprintf("at most %d", manager.MaxLabelValueBytes)},
		{"labels over the total bound", fmt.Sprintf("%d labels of %d bytes", manager.MaxLabels, manager.MaxLabelValueBytes),
			&managerv1.AllocateRequest{Labels: labels(manager.MaxLabels, manager.MaxLabelValueBytes)}, codes.InvalidArgument, fmt.Sprintf("at most %d", manager.MaxLabelBytes)},
		{"a label name with a path", `a label named "../../x"`,
			&managerv1.AllocateRequest{Labels: map[string]string{"../../x": "v"}}, codes.InvalidArgument, "bad label name"},
		{"a template naming a path", `template "../../../etc/passwd"`,
			&managerv1.AllocateRequest{Template: "../../../etc/passwd"}, codes.InvalidArgument, "../../../etc/passwd"},
		{"a 1 MiB public key", "an agent public key of 1 MiB",
			&managerv1.AllocateRequest{AgentPublicKey: make([]byte, 1<<20)}, codes.InvalidArgument, "public key"},
		{"a request over the message limit", "8 MiB of egress entries (over gRPC's 4 MiB message limit)",
			&managerv1.AllocateRequest{Egress: longEntries(8, 1<<20)}, codes.ResourceExhausted, "larger than max"},
	} {
		g.attack(tc.name, tc.tried, func(t *testing.T) verdict {
			if tc.req.AgentPublicKey == nil {
				tc.req.AgentPublicKey = key
			}
			before := s.settled(t, ctx)
			start := time.Now()
			resp, err := s.mc.Allocate(ctx, tc.req)
			took := time.Since(start)
			if err == nil {
				// Give it back: the attack succeeded, and nothing else should pay for it.
				s.mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.GetSandboxId(), LeaseToken: resp.GetLeaseToken()})
			}
			v := s.refusedUnchanged(ctx, err, tc.want, tc.mention, before)
			v.detail += fmt.Sprintf(" (in %v)", took.Round(time.Millisecond))
			return v
		})
	}
}

// longEntries returns n distinct egress entries of size bytes each.
func longEntries(n, size int) []string {
	out := make([]string, n)
	for i := range out {
		suffix := fmt.Sprintf(".h%d.fusebox.invalid:443", i)
		out[i] = strings.Repeat("a", max(1, size-len(suffix))) + suffix
	}
	return out
}
