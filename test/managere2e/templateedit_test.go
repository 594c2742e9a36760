package managere2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// `fusebox template add` and `remove` change a running `fusebox local up`'s templates: a
// template added is served warm (its allocation waits for no creation); adding it again
// with a new image replaces its warm sandboxes, while the one an agent holds keeps serving
// from the old image; the same file again changes nothing; a template whose image does not
// match its digest is refused and changes nothing; the manager's next start without
// --templates serves what it served; a removed template is refused by name, its bound
// sandbox serving on; "default" cannot be removed.
func TestTemplateAddAndRemoveWhileRunning(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	layouts := markedImages(t, e, "old", "new")
	file := filepath.Join(e.base, "web.yaml")
	write := func(image string) {
		t.Helper()
		if err := os.WriteFile(file, []byte("templates:\n- name: web\n  image: "+image+"\n  pool: {min: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mc := dialManager(t, e.Addr)
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return runFusebox(t, ctx, append([]string{"run", "--manager", e.Addr, "-q"}, args...)...)
	}
	tmpl := func(sub string, args ...string) (int, string, string) {
		t.Helper()
		return runFusebox(t, ctx, append([]string{"template", sub, "--manager", e.Addr}, args...)...)
	}
	mark := func(sb *client.Sandbox) string {
		return strings.TrimSpace(sandboxtest.Sh(t, ctx, sb, "echo $MARK"))
	}

	first := e.startLocalUp(t, "first")
	e.waitServing(t, first, mc)
	if code, _, errOut := run("--template", "web", "--", "true"); code == 0 || !strings.Contains(errOut, `"web"`) {
		t.Fatalf("run --template web before it is added: exit %d, %s", code, errOut)
	}

	write(layouts["old"])
	code, out, errOut := tmpl("add", file)
	if code != 0 || !strings.Contains(out, "web") || !strings.Contains(out, "added") {
		t.Fatalf("template add: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("template add:\n%s", out)
	_, cold := waitTemplatePool(t, ctx, mc, first, "web", "to fill", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 1 })
	key := sandboxtest.NewKey(t)
	resp, err := mc.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: "web", LeaseTtl: durationpb.New(10 * time.Minute)})
	if err != nil {
		t.Fatalf("Allocate web: %v", err)
	}
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if got := mark(sb); got != "old" {
		t.Fatalf("the sandbox of the template added says %q, want old", got)
	}
	if _, now := waitTemplatePool(t, ctx, mc, first, "web", "to refill", func(tp *managerv1.TemplatePool) bool { return tp.Units["ready"] >= 1 }); now != cold {
		t.Errorf("the allocation of the template added waited for a creation (cold waits %d, then %d)", cold, now)
	}
	var oldWarm []string
	for id, u := range list(t, ctx, mc) {
		if u.GetTemplate() == "web" && u.GetState() == managerv1.UnitState_UNIT_STATE_READY {
			oldWarm = append(oldWarm, id)
		}
	}

	write(layouts["new"])
	code, out, errOut = tmpl("add", file)
	if code != 0 || !strings.Contains(out, "replaced") {
		t.Fatalf("template add of a new image: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("template add of a new image:\n%s", out)
	for _, id := range oldWarm {
		e.waitUnitGone(t, id)
	}
	waitTemplatePool(t, ctx, mc, first, "web", "to refill from the new image", func(tp *managerv1.TemplatePool) bool {
		return tp.Units["ready"] >= 1 && tp.Image == layouts["new"]
	})
	if code, out, errOut := run("--template", "web", "--", "sh", "-c", "echo $MARK"); code != 0 || out != "new\n" {
		t.Errorf("a new allocation of web: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
	if got := mark(sb); got != "old" {
		t.Errorf("the sandbox bound before the replacement says %q, want old", got)
	}
	if code, out, errOut := tmpl("add", file); code != 0 || !strings.Contains(out, "unchanged") {
		t.Errorf("template add of the same file: exit %d\n%s%s", code, out, errOut)
	}

	// A digest the layout does not hold: refused, and nothing changes.
	missing := "sha256:" + strings.Repeat("ab", 32)
	write(filepath.Join(e.base, "images", "new") + "@" + missing)
	if code, out, errOut := tmpl("add", file); code == 0 || !strings.Contains(errOut, missing) {
		t.Errorf("template add of a digest the layout does not hold: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := tmpl("show", "web"); code != 0 || !strings.Contains(out, layouts["new"]) {
		t.Errorf("web after a refused change: exit %d\n%s", code, out)
	}

	if code := first.signal(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d", code)
	}
	second := e.startLocalUp(t, "second")
	e.waitServing(t, second, mc)
	waitTemplatePool(t, ctx, mc, second, "web", "to be served again after a restart", func(tp *managerv1.TemplatePool) bool {
		return tp.Units["ready"] >= 1 && tp.Image == layouts["new"]
	})

	code, out, errOut = tmpl("remove", "web")
	if code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("template remove: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("template remove:\n%s", out)
	if code, _, errOut := run("--template", "web", "--", "true"); code == 0 || !strings.Contains(errOut, `"web"`) {
		t.Errorf("run --template web after its removal: exit %d, %s", code, errOut)
	}
	if got := mark(sb); got != "old" {
		t.Errorf("the bound sandbox of the removed template says %q, want old", got)
	}
	if code, _, errOut := tmpl("remove", "default"); code == 0 || !strings.Contains(errOut, "always served") {
		t.Errorf("template remove default: exit %d, %s", code, errOut)
	}
	if code, out, _ := tmpl("list"); code != 0 || strings.Contains(out, "web") {
		t.Errorf("template list after the removal: exit %d\n%s", code, out)
	}
	if _, err := mc.Release(ctx, &managerv1.ReleaseRequest{SandboxId: resp.GetSandboxId(), LeaseToken: resp.GetLeaseToken()}); err != nil {
		t.Errorf("Release of the removed template's sandbox: %v", err)
	}
	e.waitUnitGone(t, resp.GetSandboxId())
	if code := second.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
}
