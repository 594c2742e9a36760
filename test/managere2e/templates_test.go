package managere2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// `fusebox local up --templates FILE` serves a template whose image holds nothing of fusebox
// (an OCI layout pinned by digest): the server is bound in read-only; the template keeps its
// own warm pool, shown by fusebox status; `fusebox run --template` runs in its image, as its
// user, with its env over the image's; the default template serves beside it; an unknown
// template is refused by name; a template whose image has no shell (and no warm pool) runs
// argv commands and refuses a script, saying why.
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
  limits: {memory: 768Mi, pids: 128}
  pool: {min: 2}
`, shellessLay, sh, lay, h)
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startLocalUp(t, "templates", "--templates", file, "--pool-size", "1")
	mc := dialManager(t, e.Addr)
	e.waitServing(t, p, mc)

	// filled waits for the plain template's pool to hold 2 ready sandboxes, and returns it
	// and the manager's cold waits so far.
	filled := func() (*managerv1.TemplatePool, uint64) {
		deadline := time.Now().Add(pollDeadline)
		for {
			ps, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tp := range ps.Pools {
				if tp.Template == "plain" && tp.Units["ready"] >= 2 {
					return tp, ps.ColdWaits
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the plain template's pool did not fill: %v\n%s", ps.Pools, p.log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	plain, _ := filled()
	if plain.Target != 2 || plain.LastError != "" {
		t.Errorf("the plain pool: %v", plain)
	}
	code, out, errOut := runFusebox(t, ctx, "status", "--manager", e.Addr)
	if code != 0 || !strings.Contains(out, "TEMPLATE") || !strings.Contains(out, "\nplain ") {
		t.Errorf("fusebox status: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--template", "plain", "--", "sh", "-c",
		`id -u; id -g; pwd; echo $GREETING $EXTRA $ONLY_IMAGE; python3 -c 'print(2)'; test -e /usr/local/bin/fusebox-sandbox && echo has-server || echo no-server; . /etc/os-release; echo $VERSION_CODENAME`)
	if want := "65534\n65534\n/srv\nfrom-template 1 kept\n2\nno-server\nbookworm\n"; code != 0 || out != want {
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
