package dataplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// codeOf is the gRPC status code of err, looking through the client's wrapping.
func codeOf(err error) codes.Code { return status.Code(err) }

// wantCode fails the test unless err carries one of the codes.
func wantCode(t testing.TB, what string, err error, want ...codes.Code) {
	t.Helper()
	if !slices.Contains(want, codeOf(err)) {
		t.Errorf("%s: got code %v (err %v), want one of %v", what, codeOf(err), err, want)
	}
}

// socketPath is the host path of a unix:// address.
func socketPath(addr string) string { return strings.TrimPrefix(addr, "unix://") }

// procScan prints, using shell builtins only (so that the scan starts no process that could
// show up in it), one line per process whose argv[0] is sleep ("sleep <pid> <args...>") and
// one line per zombie ("zombie <pid> <stat>").
const procScan = `
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] && continue
  if IFS= read -r st < "$d/stat" 2>/dev/null; then
    rest=${st##*) }
    [ "${rest%% *}" = Z ] && echo "zombie $p $st"
  fi
  args=()
  mapfile -d '' args < "$d/cmdline" 2>/dev/null || continue
  [ ${#args[@]} -gt 0 ] || continue
  [ "${args[0]##*/}" = sleep ] && echo "sleep $p ${args[*]:1}"
done
exit 0
`

// leftovers returns the sleep processes and zombies left in the sandbox.
func leftovers(t testing.TB, ctx context.Context, c *client.Sandbox) []string {
	t.Helper()
	var out []string
	for line := range strings.Lines(sandboxtest.Sh(t, ctx, c, procScan)) {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// waitNoLeftovers waits until no sleep process and no zombie remains in the sandbox. Killed
// processes die and are reaped asynchronously (SIGKILL delivery, then the server's orphan
// sweeper), so this polls.
func waitNoLeftovers(t testing.TB, ctx context.Context, c *client.Sandbox) {
	t.Helper()
	sandboxtest.Eventually(t, 30*time.Second, "no sleep process and no zombie left in the sandbox", func() (bool, string) {
		l := leftovers(t, ctx, c)
		return len(l) == 0, strings.Join(l, "; ")
	})
}

// lsA lists a directory inside the sandbox, one name a line, hidden names included.
func lsA(t testing.TB, ctx context.Context, c *client.Sandbox, dir string) []string {
	t.Helper()
	out := sandboxtest.Sh(t, ctx, c, "ls -A "+dir)
	return strings.Fields(out)
}
