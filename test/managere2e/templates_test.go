package managere2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"

	"github.com/fusebox-dev/fusebox/internal/image/registry"
	"github.com/fusebox-dev/fusebox/internal/image/registry/registrytest"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// `fusebox local up --templates FILE` serves a template whose image holds nothing of fusebox
// (an OCI layout pinned by digest): the server is bound in read-only; the template keeps its
// own warm pool, shown by fusebox status; `fusebox run --template` runs in its image, as its
// user, with its env over the image's; the default template serves beside it; an unknown
// template is refused by name; a template whose image has no shell (and no warm pool) runs
// argv commands and refuses a script, saying why; warm-up commands run before a sandbox joins
// its pool, and one that fails fails its template's pool alone, with the reason.
func TestLocalUpWithTemplates(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	img, err := imagetest.PlainImage(v1.Config{Env: []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=from-image", "ONLY_IMAGE=kept"}}, os.Stderr)
	if err != nil {
		t.Fatalf("making the plain image: %v", err)
	}
	lay := filepath.Join(e.base, "images", "plain")
	h, err := imagetest.WriteImage(lay, img)
	if err != nil {
		t.Fatal(err)
	}
	shelless, err := imagetest.ShellessImage(v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	shellessLay := filepath.Join(e.base, "images", "shelless")
	sh, err := imagetest.WriteImage(shellessLay, shelless)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.base, "templates.yaml")
	spec := fmt.Sprintf(`templates:
- name: shelless
  image: %s@%s
- name: plain
  image: %s@%s
  user: nobody
  env: {GREETING: from-template, EXTRA: "1"}
  cwd: /srv
  limits: {memory: 768Mi, pids: 128, processes: 1, processBuffer: 16Ki}
  warmUp:
  - script: echo warmed > /workspace/warm.txt
  - argv: [python3, -c, "import os"]
  pool: {min: 2}
- name: cold
  image: %s@%s
  warmUp: [{argv: ["false"]}]
  pool: {min: 1}
`, shellessLay, sh, lay, h, lay, h)
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startLocalUp(t, "templates", "--templates", file, "--pool-size", "1")
	mc := dialManager(t, e.Addr)
	e.waitServing(t, p, mc)

	// filled waits for the plain template's pool to hold 2 ready sandboxes, and returns it
	// and the manager's cold waits so far.
	filled := func() (*managerv1.TemplatePool, uint64) {
		return waitTemplatePool(t, ctx, mc, p, "plain", "to fill", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 2 })
	}
	plain, _ := filled()
	if plain.Target != 2 || plain.LastError != "" {
		t.Errorf("the plain pool: %v", plain)
	}
	code, out, errOut := runFusebox(t, ctx, "status", "--manager", e.Addr)
	if code != 0 || !strings.Contains(out, "TEMPLATE") || !strings.Contains(out, "\nplain ") {
		t.Errorf("fusebox status: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runFusebox(t, ctx, "template", "list", "--manager", e.Addr)
	if code != 0 || !strings.Contains(out, "\nplain ") || !strings.Contains(out, lay+"@"+h.String()) || !strings.Contains(out, "\ndefault ") {
		t.Errorf("fusebox template list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runFusebox(t, ctx, "template", "show", "--manager", e.Addr, "plain")
	if code != 0 || !strings.Contains(out, "image:         "+lay+"@"+h.String()) || !strings.Contains(out, "hash:          ") || !strings.Contains(out, "pool:          fixed, target 2") {
		t.Errorf("fusebox template show plain: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = runFusebox(t, ctx, "template", "show", "--manager", e.Addr, "nope")
	if code == 0 || !strings.Contains(errOut, `no template "nope"`) || !strings.Contains(errOut, "plain") {
		t.Errorf("fusebox template show nope: exit %d, stderr: %s", code, errOut)
	}

	code, out, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "plain", "--", "sh", "-c",
		`id -u; id -g; pwd; echo $GREETING $EXTRA $ONLY_IMAGE; python3 -c 'print(2)'; test -e /usr/local/bin/fusebox-sandbox && echo has-server || echo no-server; . /etc/os-release; echo $VERSION_CODENAME; cat /workspace/warm.txt`)
	if want := "65534\n65534\n/srv\nfrom-template 1 kept\n2\nno-server\nbookworm\nwarmed\n"; code != 0 || out != want {
		t.Errorf("fusebox run --template plain: exit %d\nstdout: %q\nwant:   %q\nstderr: %s", code, out, want, errOut)
	}
	// The allocation's own env and working directory, over the template's, served by a warm
	// sandbox: no cold wait.
	_, cold := filled()
	code, out, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "plain", "--env", "EXTRA=2", "--env", "NEW=x=y", "--cwd", "/tmp",
		"--", "sh", "-c", "pwd; echo $GREETING $EXTRA $NEW")
	if want := "/tmp\nfrom-template 2 x=y\n"; code != 0 || out != want {
		t.Errorf("fusebox run --env --cwd: exit %d\nstdout: %q\nwant:   %q\nstderr: %s", code, out, want, errOut)
	}
	ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ps.ColdWaits != cold {
		t.Errorf("an allocation with env and cwd waited for a cold start (%d cold waits, was %d)", ps.ColdWaits, cold)
	}
	// The template's process limits reach its sandbox's server.
	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Template: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.StartProcess(ctx, client.ProcessSpec{Argv: []string{"sleep", "1000"}}); err != nil {
		t.Fatalf("the first process on the plain template: %v", err)
	}
	if _, err := a.StartProcess(ctx, client.ProcessSpec{Argv: []string{"true"}}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "1 running") {
		t.Errorf("a second process on a template of processes: 1: %v, want RESOURCE_EXHAUSTED at 1 running", err)
	}
	a.Close()
	code, _, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--env", "1X=y", "--", "true")
	if code == 0 || !strings.Contains(errOut, `"1X" is not a variable name`) {
		t.Errorf("fusebox run --env 1X=y: exit %d, stderr: %s", code, errOut)
	}
	code, out, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--", "sh", "-c", "id -u; echo ${GREETING:-unset}")
	if code != 0 || strings.HasPrefix(out, "65534") || !strings.HasSuffix(out, "unset\n") {
		t.Errorf("fusebox run on the default template: exit %d\nstdout: %q\nstderr: %s", code, out, errOut)
	}
	code, _, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "nope", "--", "true")
	if code == 0 || !strings.Contains(errOut, `"nope"`) || !strings.Contains(errOut, "plain") {
		t.Errorf("fusebox run --template nope: exit %d, stderr: %s", code, errOut)
	}
	// An image without a shell runs argv commands, and refuses a script saying why.
	code, out, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "shelless", "--", "python3", "-c", "print(3)")
	if code != 0 || out != "3\n" {
		t.Errorf("an argv command on the shelless template: exit %d\nstdout: %q\nstderr: %s", code, out, errOut)
	}
	code, _, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "shelless", "--shell", "--", "echo hi")
	if code == 0 || !strings.Contains(errOut, "has no shell") || !strings.Contains(errOut, "run the command as argv") {
		t.Errorf("a script on the shelless template: exit %d, stderr: %s", code, errOut)
	}
	// A template whose warm-up fails fails its own pool, with the reason, and no other.
	failed, _ := waitTemplatePool(t, ctx, mc, p, "cold", "to show its warm-up's failure", func(tp *managerv1.TemplatePool) bool {
		return strings.Contains(tp.LastError, "warm-up command 1") && strings.Contains(tp.LastError, "exit 1")
	})
	if failed.Units["ready"] != 0 {
		t.Errorf("the failing template's pool holds ready units: %v", failed)
	}
	filled()
	if l := p.log(); !strings.Contains(l, h.String()) {
		t.Errorf("local up does not log the template's image digest:\n%s", l)
	}
	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
}

// A templates file local up cannot use stops it at once, with an error naming the entry and
// its field, or the image.
func TestLocalUpRefusesBadTemplates(t *testing.T) {
	e := newEnv(t)
	for i, tc := range []struct{ file, want string }{
		{"templates:\n- name: web\n  image: localhost:5000/web:latest\n", "templates[0] (web): image \"localhost:5000/web:latest\" is not pinned by digest"},
		{"templates:\n- name: web\n  image: " + e.base + "/missing@sha256:" + strings.Repeat("ab", 32) + "\n", "no such directory"},
		{"templates:\n- name: web\n  image: " + e.base + "@sha256:" + strings.Repeat("ab", 32) + "\n  limits: {memroy: 1Gi}\n", `unknown field "memroy"`},
	} {
		file := filepath.Join(e.base, fmt.Sprintf("bad%d.yaml", i))
		if err := os.WriteFile(file, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		p := e.startLocalUp(t, fmt.Sprintf("bad-templates-%d", i), "--templates", file)
		if code := p.wait(t); code == 0 {
			t.Errorf("%s: exit 0", tc.file)
		}
		if l := p.log(); !strings.Contains(l, tc.want) {
			t.Errorf("%s: the error does not say %q:\n%s", tc.file, tc.want, l)
		}
	}
}

// A template pulled from a registry on loopback (Debian's docker-registry: TLS from a test
// CA, trusted through SSL_CERT_FILE, and htpasswd credentials read from the standard Docker
// config) by digest; its pool and another template's refill separately: demand for one never
// takes or makes a unit of the other.
func TestLocalUpWithARegistryTemplate(t *testing.T) {
	reg := registrytest.Start(t)
	t.Setenv("DOCKER_CONFIG", reg.DockerConfig) // inherited by local up
	t.Setenv("SSL_CERT_FILE", reg.CAFile)
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	cfg := v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	img, err := imagetest.PlainImage(cfg, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.Open(ctx, reg.Host+"/fusebox", registry.Options{CAFile: reg.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := r.Push("plain", img)
	if err != nil {
		t.Fatalf("pushing the template's image: %v", err)
	}
	other, err := imagetest.ShellessImage(cfg, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(e.base, "images", "other")
	h, err := imagetest.WriteImage(lay, other)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.base, "templates.yaml")
	spec := fmt.Sprintf("templates:\n- name: pulled\n  image: %s\n  pool: {min: 1}\n- name: other\n  image: %s@%s\n  pool: {min: 1}\n", ref, lay, h)
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startLocalUp(t, "registry-template", "--templates", file, "--pool-size", "1")
	mc := dialManager(t, e.Addr)
	e.waitServing(t, p, mc)
	// readyOf returns the ids of the ready sandboxes of template tmpl, once there is one.
	readyOf := func(tmpl string) []string {
		deadline := time.Now().Add(pollDeadline)
		for {
			var ids []string
			for id, sb := range list(t, ctx, mc) {
				if sb.Template == tmpl && sb.State == managerv1.UnitState_UNIT_STATE_READY {
					ids = append(ids, id)
				}
			}
			if len(ids) > 0 {
				slices.Sort(ids)
				return ids
			}
			if time.Now().After(deadline) {
				t.Fatalf("no ready sandbox of %s\n%s", tmpl, p.log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	before := readyOf("other")
	for range 3 {
		code, out, errOut := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "pulled", "--", "sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME")
		if code != 0 || out != "bookworm\n" {
			t.Fatalf("fusebox run --template pulled: exit %d\nstdout: %q\nstderr: %s", code, out, errOut)
		}
	}
	readyOf("pulled") // refilled
	if after := readyOf("other"); !slices.Equal(before, after) {
		t.Errorf("demand for one template changed the other's pool: ready %v, then %v", before, after)
	}
	if l := p.log(); !strings.Contains(l, reg.Host) {
		t.Errorf("local up does not log the image it pulled:\n%s", l)
	}
	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
}

// waitTemplatePool waits until the pool of template tmpl satisfies cond (what describes the
// wait in a failure), and returns it and the manager's cold waits so far.
func waitTemplatePool(t *testing.T, ctx context.Context, mc managerv1.ManagerClient, p *proc, tmpl, what string,
	cond func(*managerv1.TemplatePool) bool) (*managerv1.TemplatePool, uint64) {
	t.Helper()
	deadline := time.Now().Add(pollDeadline)
	for {
		ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range ps.Pools {
			if tp.Template == tmpl && cond(tp) {
				return tp, ps.ColdWaits
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s template's pool did not come %s: %v\n%s", tmpl, what, ps.Pools, p.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// markedImages writes, for each mark, an image of Debian's userland alone whose environment
// has MARK set to it, as an OCI layout under e's directory, and returns their references
// (layout@digest) by mark.
func markedImages(t *testing.T, e *env, marks ...string) map[string]string {
	t.Helper()
	layouts := map[string]string{}
	for _, mark := range marks {
		img, err := imagetest.PlainImage(v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "MARK=" + mark}}, os.Stderr)
		if err != nil {
			t.Fatal(err)
		}
		lay := filepath.Join(e.base, "images", mark)
		h, err := imagetest.WriteImage(lay, img)
		if err != nil {
			t.Fatal(err)
		}
		layouts[mark] = lay + "@" + h.String()
	}
	return layouts
}

// A template's image changed between two runs of `fusebox local up` on one state directory:
// the sandbox bound from the old image lives on and keeps serving from it, adopted by the
// second manager with its lease; the old image's warm sandboxes are destroyed; the template's
// pool refills from the new image, which its next allocation gets, under a new hash.
func TestTemplateImageChangeKeepsTheBoundSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	layouts := markedImages(t, e, "old", "new")
	file := filepath.Join(e.base, "templates.yaml")
	write := func(mark string) {
		t.Helper()
		if err := os.WriteFile(file, []byte("templates:\n- name: web\n  image: "+layouts[mark]+"\n  pool: {min: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mc := dialManager(t, e.Addr)
	web := func(p *proc, what string, cond func(*managerv1.TemplatePool) bool) *managerv1.TemplatePool {
		tp, _ := waitTemplatePool(t, ctx, mc, p, "web", what, cond)
		return tp
	}
	mark := func(sb *client.Sandbox) string {
		return strings.TrimSpace(sandboxtest.Sh(t, ctx, sb, "echo $MARK"))
	}

	write("old")
	first := e.startLocalUp(t, "old-image", "--templates", file)
	e.waitServing(t, first, mc)
	before := web(first, "to fill", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 1 })
	key := sandboxtest.NewKey(t)
	resp, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: "web", LeaseTtl: durationpb.New(10 * time.Minute)})
	if err != nil {
		t.Fatalf("Allocate web: %v", err)
	}
	bound := resp.GetSandboxId()
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if got := mark(sb); got != "old" {
		t.Fatalf("the sandbox bound from the old image says %q", got)
	}
	units := list(t, ctx, mc)
	web(first, "to refill", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 1 })
	var oldWarm []string
	for id, u := range list(t, ctx, mc) {
		if u.GetTemplate() == "web" && u.GetState() == managerv1.UnitState_UNIT_STATE_READY {
			oldWarm = append(oldWarm, id)
		}
	}
	if len(oldWarm) == 0 || units[bound].GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
		t.Fatalf("before the change: warm %v, bound %v", oldWarm, units[bound])
	}
	if code := first.signal(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d", code)
	}

	write("new")
	second := e.startLocalUp(t, "new-image", "--templates", file)
	e.waitServing(t, second, mc)
	for _, id := range oldWarm {
		e.waitUnitGone(t, id)
	}
	after := web(second, "to refill from the new image", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 1 })
	if after.Hash == before.Hash || after.Image != layouts["new"] {
		t.Errorf("the template after the change: image %s, hash %s (was %s)", after.Image, after.Hash, before.Hash)
	}
	if u := list(t, ctx, mc)[bound]; u.GetState() != managerv1.UnitState_UNIT_STATE_BOUND {
		t.Errorf("the sandbox bound before the change is %v, want BOUND (adopted)", u)
	}
	if got := mark(sb); got != "old" {
		t.Errorf("the sandbox bound before the change now says %q, want old: it must keep its image", got)
	}
	code, out, errOut := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "web", "--", "sh", "-c", "echo $MARK")
	if code != 0 || out != "new\n" {
		t.Errorf("a new allocation of web: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: bound, LeaseToken: resp.GetLeaseToken()}); err != nil {
		t.Errorf("Release of the adopted sandbox: %v", err)
	}
	e.waitUnitGone(t, bound)
	if code := second.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
}
