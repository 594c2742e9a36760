package kube

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/transport"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

const testAudience = "fusebox-test-manager"

// serviceAccountToken creates ServiceAccount ns/name if needed and returns a token for it
// from the API server's TokenRequest, with audience aud.
func serviceAccountToken(t *testing.T, ctx context.Context, ns, name, aud string) string {
	t.Helper()
	sas := env.Client.CoreV1().ServiceAccounts(ns)
	if _, err := sas.Get(ctx, name, metav1.GetOptions{}); err != nil {
		if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exp := int64(600)
	tr, err := sas.CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{aud}, ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// expiredToken re-signs a real token's claims, with an expiry in the past, with the API
// server's ServiceAccount signing key: a token the API server itself issued, expired.
func expiredToken(t *testing.T, real string) string {
	t.Helper()
	parts := strings.Split(real, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour).Unix()
	claims["exp"], claims["iat"], claims["nbf"] = past, past-600, past-600
	body, _ := json.Marshal(claims)
	signing := parts[0] + "." + base64.RawURLEncoding.EncodeToString(body)
	keyPEM, err := os.ReadFile(filepath.Join(env.Dir, "pki", "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	var key *rsa.PrivateKey
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		key = k.(*rsa.PrivateKey)
	} else {
		t.Fatalf("sa.key: %v", err)
	}
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestManagerAPIAuthentication: a manager serving TCP creates its TLS Secret in the real API
// server and publishes the CA; agents authenticate with ServiceAccount tokens from
// TokenRequest, checked by TokenReview; the policy, List's filtering and the lease tokens hold.
func TestManagerAPIAuthentication(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	mgrNS, agents, others := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	dir := t.TempDir()
	policy := writeFile(t, dir, "policy.yaml", "rules:\n- namespaces: ["+agents+"]\n  egress: [\"pypi.org:443\"]\n")
	cfg := daemon.Config{
		Listen: "tcp://127.0.0.1:0", Allocator: "process", Insecure: true, StateDir: t.TempDir(),
		SandboxBinary: sandboxtest.SandboxBinary(t), Estimator: "fixed", PoolSize: 1, PoolMax: 1,
		Kube: daemon.KubeConfig{Kubeconfig: filepath.Join(env.Dir, "kubeconfig"), ManagerNamespace: mgrNS},
		Auth: daemon.AuthConfig{TLSSecret: "fusebox-manager-tls", TLSSecretCreate: true, TLSDNSNames: []string{"fusebox-manager." + mgrNS + ".svc"},
			CAConfigMap: "fusebox-manager-ca", TokenAudience: testAudience, PolicyFile: policy},
	}
	ready := make(chan string, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- daemon.Run(runCtx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager exit: %v", err)
		}
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("manager exited: %v", err)
	case <-ctx.Done():
		t.Fatal("manager not ready")
	}

	// The CA, as an agent reads it from the ConfigMap the manager published.
	cm, err := env.Client.CoreV1().ConfigMaps(mgrNS).Get(ctx, "fusebox-manager-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CA ConfigMap: %v", err)
	}
	secret, err := env.Client.CoreV1().Secrets(mgrNS).Get(ctx, "fusebox-manager-tls", metav1.GetOptions{})
	if err != nil || secret.Type != corev1.SecretTypeTLS || string(secret.Data[transport.KeyCA]) != cm.Data[transport.KeyCA] {
		t.Fatalf("TLS Secret %v: %v", secret, err)
	}
	caFile := writeFile(t, dir, "ca.crt", cm.Data[transport.KeyCA])
	serverName := "fusebox-manager." + mgrNS + ".svc"

	tokenFile := func(name, token string) string { return writeFile(t, dir, name+".token", token) }
	coder := tokenFile("coder", serviceAccountToken(t, ctx, agents, "coder", testAudience))
	helper := tokenFile("helper", serviceAccountToken(t, ctx, agents, "helper", testAudience))
	connect := func(tok string) managerv1.ManagerClient {
		t.Helper()
		opts := []client.ManagerOption{client.WithCAFile(caFile), client.WithServerName(serverName)}
		if tok != "" {
			opts = append(opts, client.WithTokenFile(tok))
		}
		conn, err := client.DialManager(addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return managerv1.NewManagerClient(conn)
	}
	key, _ := client.NewKey()
	allocate := func(c managerv1.ManagerClient, egress ...string) (*managerv1.AllocateResponse, error) {
		return c.Allocate(ctx, &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: egress})
	}
	refused := func(what string, err error, code codes.Code, msg string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
			t.Errorf("%s: %v, want %v containing %q", what, err, code, msg)
		}
	}

	t.Run("right audience, through the SDK", func(t *testing.T) {
		a, err := client.Allocate(ctx, addr, client.AllocateOptions{TokenFile: coder, CAFile: caFile, ServerName: serverName})
		if err != nil {
			t.Fatal(err)
		}
		res, err := a.Exec(ctx, client.Command{Argv: []string{"echo", "authenticated"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v, %v", res, err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	})

	coderC, helperC := connect(coder), connect(helper)
	mine, err := allocate(coderC)
	if err != nil {
		t.Fatalf("agents/coder: %v", err)
	}
	theirs, err := allocate(helperC)
	if err != nil {
		t.Fatalf("agents/helper: %v", err)
	}
	t.Run("List shows only the caller's sandboxes", func(t *testing.T) {
		for _, c := range []struct {
			who  string
			mc   managerv1.ManagerClient
			want string
		}{{"coder", coderC, mine.SandboxId}, {"helper", helperC, theirs.SandboxId}} {
			l, err := c.mc.List(ctx, &managerv1.ListRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range l.Sandboxes {
				got = append(got, s.SandboxId)
			}
			if !slices.Equal(got, []string{c.want}) {
				t.Errorf("%s sees %v, want only [%s]", c.who, got, c.want)
			}
		}
	})
	t.Run("Release and Renew still need the lease token", func(t *testing.T) {
		_, err := helperC.Release(ctx, &managerv1.ReleaseRequest{SandboxId: mine.SandboxId, LeaseToken: theirs.LeaseToken})
		refused("releasing another's sandbox", err, codes.PermissionDenied, "lease token")
		_, err = helperC.Renew(ctx, &managerv1.RenewRequest{SandboxId: mine.SandboxId, LeaseToken: "guess"})
		refused("renewing another's sandbox", err, codes.PermissionDenied, "lease token")
		if _, err := coderC.Renew(ctx, &managerv1.RenewRequest{SandboxId: mine.SandboxId, LeaseToken: mine.LeaseToken}); err != nil {
			t.Errorf("renewing with the token: %v", err)
		}
		if _, err := coderC.Release(ctx, &managerv1.ReleaseRequest{SandboxId: mine.SandboxId, LeaseToken: mine.LeaseToken}); err != nil {
			t.Errorf("releasing with the token: %v", err)
		}
		helperC.Release(ctx, &managerv1.ReleaseRequest{SandboxId: theirs.SandboxId, LeaseToken: theirs.LeaseToken})
	})
	t.Run("egress outside the ceiling", func(t *testing.T) {
		_, err := allocate(coderC, "pypi.org:443", "evil.example:443")
		refused("egress outside the ceiling", err, codes.PermissionDenied, "egress destination evil.example:443 is outside the ceiling of service account "+agents+"/coder")
	})
	t.Run("wrong audience", func(t *testing.T) {
		_, err := allocate(connect(tokenFile("wrongaud", serviceAccountToken(t, ctx, agents, "coder", "https://kubernetes.default.svc"))))
		refused("a token for the API server", err, codes.Unauthenticated, `is not the manager's audience "`+testAudience+`"`)
	})
	t.Run("expired token", func(t *testing.T) {
		expired := expiredToken(t, serviceAccountToken(t, ctx, agents, "coder", testAudience))
		// The API server itself refuses it ...
		r, err := auth.KubeTokenReviewer(env.Client)(ctx, expired, []string{testAudience})
		if err != nil || r.Authenticated {
			t.Fatalf("TokenReview of an expired token: %+v, %v", r, err)
		}
		t.Logf("the API server on the expired token: %s", r.Error)
		// ... and so does the manager, saying why.
		_, err = allocate(connect(tokenFile("expired", expired)))
		refused("an expired token", err, codes.Unauthenticated, "the token expired at")
	})
	t.Run("a forged token", func(t *testing.T) {
		real := serviceAccountToken(t, ctx, agents, "coder", testAudience)
		forged := real[:strings.LastIndexByte(real, '.')] + ".c2lnbmF0dXJl"
		_, err := allocate(connect(tokenFile("forged", forged)))
		refused("a token with a bad signature", err, codes.Unauthenticated, "the Kubernetes API refused the token")
	})
	t.Run("ServiceAccount outside the policy", func(t *testing.T) {
		_, err := allocate(connect(tokenFile("outsider", serviceAccountToken(t, ctx, others, "intruder", testAudience))))
		refused("an account outside the policy", err, codes.PermissionDenied, "service account "+others+"/intruder may not allocate sandboxes")
	})
	t.Run("unauthenticated client", func(t *testing.T) {
		_, err := allocate(connect(""))
		refused("no token", err, codes.Unauthenticated, "no bearer token")
	})
	t.Run("plaintext client", func(t *testing.T) {
		conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(addr, "tcp://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = allocate(managerv1.NewManagerClient(conn))
		refused("a plaintext client", err, codes.Unauthenticated, "this manager serves TLS only")
		if _, err := client.Allocate(ctx, addr, client.AllocateOptions{}); !errors.Is(err, client.ErrNoManagerTLS) {
			t.Errorf("the SDK without a CA: %v", err)
		}
	})
}
