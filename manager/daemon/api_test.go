package daemon

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

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
			_, err := secureAPI(context.Background(), tt.addr, Config{Auth: tt.a}, log)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("secureAPI = %v, want an error containing %q", err, tt.msg)
			}
		})
	}
	if a, err := secureAPI(context.Background(), unix, Config{}, log); err != nil || a.group != -1 {
		t.Fatalf("plain unix socket: %+v, %v", a, err)
	}
}
