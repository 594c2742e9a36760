// Package adversarial attacks a running manager and its gVisor sandboxes the way untrusted
// code and untrusted callers can: from inside a sandbox (the kernel boundary, the network, the
// egress proxy, the processes and memory it may use), over the data plane (the sFuse and the
// TLS pin, the file API's jail) and over the manager's API (leases, allocation requests).
//
// Every attack records what it tried and how it ended: refused (the attempt failed where it
// was made, with the error a real refusal gives), contained (it ran, and its effect stayed
// inside the attacked sandbox: the sandbox, the manager and a bystander sandbox keep serving),
// or succeeded, which fails the test naming the attack. TestMain prints a table of the
// attempts per group after the run.
//
// One in-process manager (what `fusebox local up` runs) serves the whole package. Attacks that
// cannot hurt the next one share a sandbox within their group; those that can get a fresh one.
// Every network address the tests use is a unix socket or on loopback; addresses elsewhere
// are only ever tried from inside a sandbox, after checking that it has no network interface
// but loopback (--network=none), so that the attempt fails in the sandbox's own kernel.
package adversarial

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

func TestMain(m *testing.M) {
	start := time.Now()
	code := m.Run()
	attempts.print(os.Stdout, time.Since(start))
	os.Exit(code)
}

// outcome is how an attack ended.
type outcome int

const (
	refused   outcome = iota // the attempt failed where it was made
	contained                // it ran, and its effect stayed in the attacked sandbox
	succeeded                // it got past the boundary it attacked
)

// verdict is an attack's outcome and what showed it.
type verdict struct {
	outcome outcome
	detail  string
}

func refusedf(format string, a ...any) verdict { return verdict{refused, fmt.Sprintf(format, a...)} }
func containedf(format string, a ...any) verdict {
	return verdict{contained, fmt.Sprintf(format, a...)}
}
func escapedf(format string, a ...any) verdict { return verdict{succeeded, fmt.Sprintf(format, a...)} }

// tally counts the attempts of one group.
type tally struct {
	tried, refused, contained, succeeded int
}

// recorder holds the attempts of the whole run.
type recorder struct {
	mu     sync.Mutex // guards groups and order
	groups map[string]*tally
	order  []string
}

var attempts = &recorder{groups: map[string]*tally{}}

func (r *recorder) group(name string) *tally {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[name]
	if g == nil {
		g = &tally{}
		r.groups[name] = g
		r.order = append(r.order, name)
	}
	return g
}

func (r *recorder) add(group string, f func(*tally)) {
	g := r.group(group)
	r.mu.Lock()
	defer r.mu.Unlock()
	f(g)
}

// print writes the table of attempts per group. An attempt that is tried but neither
// refused, contained nor succeeded was cut off by a failure of the test itself.
func (r *recorder) print(f *os.File, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.order) == 0 {
		return
	}
	fmt.Fprintf(f, "\nadversarial attempts (%v):\n", took.Round(time.Second))
	w := tabwriter.NewWriter(f, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "group\ttried\trefused\tcontained\tsucceeded\tunsettled\t")
	var sum tally
	row := func(name string, g *tally) {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t\n", name, g.tried, g.refused, g.contained, g.succeeded,
			g.tried-g.refused-g.contained-g.succeeded)
	}
	for _, name := range r.order {
		g := r.groups[name]
		row(name, g)
		sum.tried += g.tried
		sum.refused += g.refused
		sum.contained += g.contained
		sum.succeeded += g.succeeded
	}
	row("total", &sum)
	w.Flush()
}

// group runs the attacks of one group as subtests of t.
type group struct {
	name string
	t    *testing.T
	ctx  context.Context
}

func newGroup(t *testing.T, name string) *group {
	attempts.group(name)
	return &group{name: name, t: t, ctx: testenv.Context(t, 8*time.Minute)}
}

// attack runs one attack as a subtest named name: tried says what it attempts, do makes the
// attempt and judges it. A successful attack fails the subtest.
func (g *group) attack(name, tried string, do func(t *testing.T) verdict) {
	g.t.Helper()
	g.t.Run(name, func(t *testing.T) {
		t.Helper()
		attempts.add(g.name, func(c *tally) { c.tried++ })
		t.Logf("tried: %s", tried)
		v := do(t)
		attempts.add(g.name, func(c *tally) {
			switch v.outcome {
			case refused:
				c.refused++
			case contained:
				c.contained++
			default:
				c.succeeded++
			}
		})
		switch v.outcome {
		case refused:
			t.Logf("refused: %s", v.detail)
		case contained:
			t.Logf("contained: %s", v.detail)
		default:
			t.Errorf("attack %s/%s succeeded (%s): %s", g.name, name, tried, v.detail)
		}
	})
}

// shell runs script in the sandbox as an attack that must fail: a zero exit is a success of
// the attack; a failure counts as refused only if its standard error holds one of why (the
// error a real refusal gives), so that a missing tool or a typo cannot pass for a refusal.
func shell(t *testing.T, ctx context.Context, c *client.Sandbox, script string, why ...string) verdict {
	t.Helper()
	res := run(t, ctx, c, client.Command{Script: script, Timeout: time.Minute})
	out := strings.TrimSpace(string(res.Stdout))
	errs := strings.TrimSpace(string(res.Stderr))
	if res.ExitCode == 0 {
		return escapedf("exit 0, stdout %.300q, stderr %.300q", out, errs)
	}
	for _, w := range why {
		if strings.Contains(errs, w) || strings.Contains(out, w) {
			return refusedf("exit %d: %.200s", res.ExitCode, errs)
		}
	}
	t.Fatalf("%s: exit %d, stdout %.300q, stderr %.300q; want an error containing one of %q", script, res.ExitCode, out, errs, why)
	return verdict{}
}

// python runs a Python program in the sandbox that reports its attempt by printing a line
// "REFUSED <why>" or "ESCAPED <what>"; any other output fails the test.
func python(t *testing.T, ctx context.Context, c *client.Sandbox, program string, args ...string) verdict {
	t.Helper()
	res := run(t, ctx, c, client.Command{Argv: append([]string{"python3", "-c", program}, args...), Timeout: time.Minute})
	out := strings.TrimSpace(string(res.Stdout))
	switch {
	case strings.Contains(out, "ESCAPED"):
		return escapedf("%.400s", out)
	case strings.HasPrefix(out, "REFUSED"):
		return refusedf("%.300s", out)
	}
	t.Fatalf("python attempt: exit %d, stdout %.300q, stderr %.500q; want REFUSED or ESCAPED", res.ExitCode, out, res.Stderr)
	return verdict{}
}

// run runs cmd in the sandbox; the call itself must succeed (the command may fail).
func run(t *testing.T, ctx context.Context, c *client.Sandbox, cmd client.Command) *client.Result {
	t.Helper()
	res, err := c.Exec(ctx, cmd)
	if err != nil {
		t.Fatalf("exec %q %q: %v", cmd.Argv, cmd.Script, err)
	}
	return res
}
