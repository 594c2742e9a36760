package adversarial

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// leaseAttacks act on leases without their token, with another lease's token, and after
// release.
func leaseAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "lease")
	ctx := g.ctx
	victim := s.allocate(t, ctx)
	attacker := s.allocate(t, ctx)

	// unchanged returns an error unless target is bound with its lease ending as it did, and
	// serves.
	expiry := func(target *lease) (time.Time, error) {
		units, err := s.list(ctx)
		if err != nil {
			return time.Time{}, err
		}
		u := units[target.ID]
		if u.GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
			return time.Time{}, fmt.Errorf("%s is %v", target.ID, u.GetState())
		}
		return u.GetLeaseExpires().AsTime(), nil
	}
	wantRefused := func(target *lease, err error, want ...codes.Code) verdict {
		if !slices.Contains(want, status.Code(err)) {
			return escapedf("got %v (%v), want %v", status.Code(err), err, want)
		}
		if err := serves(ctx, target); err != nil {
			return escapedf("refused with %v, but then %v", status.Code(err), err)
		}
		return refusedf("%v: %.200s", status.Code(err), status.Convert(err).Message())
	}

	type action struct {
		name, tried string
		target      *lease
		do          func() error
	}
	renew := func(id, token string) func() error {
		return func() error {
			_, err := s.mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: id, LeaseToken: token, LeaseTtl: durationpb.New(time.Hour)})
			return err
		}
	}
	release := func(id, token string) func() error {
		return func() error {
			_, err := s.mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: id, LeaseToken: token})
			return err
		}
	}
	for _, a := range []action{
		{"renew without the token", "Renew(victim, no token)", victim, renew(victim.ID, "")},
		{"release without the token", "Release(victim, no token)", victim, release(victim.ID, "")},
		{"release with a guessed token", "Release(victim, a token of the right length)", victim, release(victim.ID, strings.Repeat("A", len(victim.Token)))},
		{"release with another lease's token", "Release(victim, the attacker's own token)", victim, release(victim.ID, attacker.Token)},
		{"renew with another lease's token", "Renew(victim, the attacker's own token)", victim, renew(victim.ID, attacker.Token)},
		{"release the bystander", "Release(bystander, the attacker's own token)", s.bystander, release(s.bystander.ID, attacker.Token)},
		{"release with a token prefix", "Release(victim, the victim's token without its last byte)", victim, release(victim.ID, victim.Token[:len(victim.Token)-1])},
	} {
		g.attack(a.name, a.tried, func(t *testing.T) verdict {
			before, err := expiry(a.target)
			if err != nil {
				t.Fatal(err)
			}
			v := wantRefused(a.target, a.do(), codes.PermissionDenied)
			if after, err := expiry(a.target); err != nil || !after.Equal(before) {
				return escapedf("%s; the lease was %v, is now %v (%v)", v.detail, before, after, err)
			}
			return v
		})
	}
	g.attack("renew past the ceiling", "Renew(own lease, 100 years): the lease must end within the manager's maximum (24h)", func(t *testing.T) verdict {
		_, err := s.mc.Renew(ctx, &managerv1.RenewRequest{SandboxId: attacker.ID, LeaseToken: attacker.Token, LeaseTtl: durationpb.New(100 * 365 * 24 * time.Hour)})
		if err != nil {
			return refusedf("%v", err)
		}
		end, err := expiry(attacker)
		if err != nil {
			t.Fatal(err)
		}
		if end.After(time.Now().Add(24*time.Hour + time.Minute)) {
			return escapedf("the lease ends %v", end)
		}
		return refusedf("capped: the lease ends %v", end.Round(time.Second))
	})

	// Release the victim with its token, then try to use what it had.
	if _, err := s.mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: victim.ID, LeaseToken: victim.Token}); err != nil {
		t.Fatalf("releasing with the right token: %v", err)
	}
	sandboxtest.Eventually(t, 2*time.Minute, "the released sandbox destroyed", func() (bool, string) {
		ids, err := s.m.Containers(ctx)
		return err == nil && !slices.Contains(ids, victim.ID), fmt.Sprintf("containers %v, %v", ids, err)
	})
	gone := []codes.Code{codes.NotFound, codes.FailedPrecondition}
	g.attack("renew after release", "Renew(released lease, its token)", func(t *testing.T) verdict {
		return judgeCode(renew(victim.ID, victim.Token)(), gone...)
	})
	g.attack("release after release", "Release(released lease, its token)", func(t *testing.T) verdict {
		return judgeCode(release(victim.ID, victim.Token)(), gone...)
	})
	g.attack("use the data plane after release", "Exec and Stat over the released sandbox's open connection", func(t *testing.T) verdict {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := victim.C.Exec(cctx, client.Command{Script: "echo still here"}); err == nil {
			return escapedf("a command ran in the released sandbox")
		}
		_, err := victim.C.Stat(cctx, ".", false)
		if err == nil {
			return escapedf("Stat answered in the released sandbox")
		}
		return refusedf("%.200v", err)
	})
	g.attack("reconnect after release", "client.Dial to the released sandbox's endpoint with its keys, then Exec", func(t *testing.T) verdict {
		c, err := client.Dial(victim.Endpoint, victim.SandboxKey, victim.Key)
		if err == nil {
			defer c.Close()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err = c.Exec(cctx, client.Command{Script: "echo still here"})
		}
		if err == nil {
			return escapedf("a command ran in the released sandbox")
		}
		return refusedf("%.200v", err)
	})
	g.attack("a released token on a new lease", "Release(a new allocation, the released lease's token)", func(t *testing.T) verdict {
		fresh := s.allocate(t, ctx)
		return wantRefused(fresh, release(fresh.ID, victim.Token)(), codes.PermissionDenied)
	})
	if err := s.unharmed(ctx, attacker); err != nil {
		t.Errorf("after the lease attacks: %v", err)
	}
}

// judgeCode is refused if err carries one of want, else a success naming what it got.
func judgeCode(err error, want ...codes.Code) verdict {
	if !slices.Contains(want, status.Code(err)) {
		return escapedf("got %v (%v), want %v", status.Code(err), err, want)
	}
	return refusedf("%v: %.200s", status.Code(err), status.Convert(err).Message())
}
