package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
)

func TestSecureAPIRefusesIncompleteConfig(t *testing.T) {
	unix, _ := endpoint.Parse("unix:///run/fusebox/manager.sock")
	tcp, _ := endpoint.Parse("tcp://0.0.0.0:9090")
	tests := []struct {
		name string
		addr endpoint.Addr
		a    AuthConfig
		msg  string
	}{
		{"TLS on a unix socket", unix, AuthConfig{TLSCertFile: "c"}, "guarded by its file permissions"},
		{"audience on a unix socket", unix, AuthConfig{TokenAudience: "x"}, "are for tcp:// listeners"},
		{"unknown group", unix, AuthConfig{ListenGroup: "no-such-group-fusebox"}, "--listen-group"},
		{"group on TCP", tcp, AuthConfig{ListenGroup: "root"}, "--listen-group is for a unix socket"},
		{"no audience", tcp, AuthConfig{TLSSecret: "s"}, "give --token-audience"},
		{"no certificate", tcp, AuthConfig{TokenAudience: "x"}, "serves TLS: give --tls-cert-file and --tls-key-file, or --tls-secret"},
		{"both certificates", tcp, AuthConfig{TokenAudience: "x", TLSSecret: "s", TLSCertFile: "c", TLSKeyFile: "k"}, "not both"},
		{"half a pair", tcp, AuthConfig{TokenAudience: "x", TLSCertFile: "c"}, "go together"},
		{"no Kubernetes API", tcp, AuthConfig{TokenAudience: "x", TLSCertFile: "c", TLSKeyFile: "k"}, "reviews agents' tokens with the Kubernetes API"},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := secureAPI(context.Background(), tt.addr, Config{Auth: tt.a}, prometheus.NewRegistry(), log)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("secureAPI = %v, want an error containing %q", err, tt.msg)
			}
		})
	}
	if a, err := secureAPI(context.Background(), unix, Config{}, prometheus.NewRegistry(), log); err != nil || a.group != -1 {
		t.Fatalf("plain unix socket: %+v, %v", a, err)
	}
}

// TestShareSocketGivesItToTheGroup: a unix listener stays its owner's alone (0600, as
// endpoint.Listen makes it) unless --listen-group names a group, which then gets the socket
// (0660); a TCP listener has nothing to share.
func TestShareSocketGivesItToTheGroup(t *testing.T) {
	own := strconv.Itoa(os.Getegid())
	// Root may give the socket to any group: one it is not in shows the chown happened.
	g, err := user.LookupGroup("nogroup")
	if err != nil || os.Geteuid() != 0 {
		if g, err = user.LookupGroupId(own); err != nil {
			t.Skipf("this process's group has no name: %v", err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		name, group, gid string
		mode             os.FileMode
	}{{"owner only", "", own, 0o600}, {"shared with " + g.Name, g.Name, g.Gid, 0o660}} {
		t.Run(c.name, func(t *testing.T) {
			addr, err := endpoint.Parse("unix://" + filepath.Join(t.TempDir(), "manager.sock"))
			if err != nil {
				t.Fatal(err)
			}
			ln, err := endpoint.Listen(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			a, err := secureAPI(context.Background(), addr, Config{Auth: AuthConfig{ListenGroup: c.group}}, prometheus.NewRegistry(), log)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.shareSocket(addr); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(addr.Address)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != c.mode {
				t.Errorf("socket mode %v, want %v", fi.Mode().Perm(), c.mode)
			}
			if gid := fi.Sys().(*syscall.Stat_t).Gid; strconv.Itoa(int(gid)) != c.gid {
				t.Errorf("socket group %d, want %s", gid, c.gid)
			}
		})
	}
}
