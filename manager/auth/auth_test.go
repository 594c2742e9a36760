package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// recorder is a test service that records the identity each call carried.
type recorder struct {
	testgrpc.UnimplementedTestServiceServer
	mu  sync.Mutex
	ids []Identity
	oks []bool
}

func (r *recorder) note(ctx context.Context) {
	id, ok := FromContext(ctx)
	r.mu.Lock()
	r.ids, r.oks = append(r.ids, id), append(r.oks, ok)
	r.mu.Unlock()
}

func (r *recorder) last() (Identity, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[len(r.ids)-1], r.oks[len(r.oks)-1]
}

func (r *recorder) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	r.note(ctx)
	return &testgrpc.Empty{}, nil
}

func (r *recorder) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, s testgrpc.TestService_StreamingOutputCallServer) error {
	r.note(s.Context())
	return nil
}

func serve(t *testing.T, ln net.Listener, creds credentials.TransportCredentials, a *Authenticator) *recorder {
	t.Helper()
	opts := append(a.ServerOptions(), grpc.Creds(creds))
	srv := grpc.NewServer(opts...)
	rec := &recorder{}
	testgrpc.RegisterTestServiceServer(srv, rec)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return rec
}

func dial(t *testing.T, target string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestUnixSocketCallerIsItsUID(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(t, ln, PeerCredentials(), NewAuthenticator(AuthenticatorOptions{}))
	c := testgrpc.NewTestServiceClient(dial(t, "unix://"+sock, insecure.NewCredentials()))
	ctx := context.Background()
	if _, err := c.EmptyCall(ctx, &testgrpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	id, ok := rec.last()
	want := LocalIdentity(uint32(os.Geteuid()), true) // the manager's own user is an operator
	if !ok || id != want {
		t.Fatalf("identity %+v (%v), want %+v", id, ok, want)
	}
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s.Recv()
	if id, ok := rec.last(); !ok || id != want {
		t.Fatalf("stream identity %+v (%v), want %+v", id, ok, want)
	}
}

// selfSigned returns a server certificate for "manager.test" and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "manager.test"}, DNSNames: []string{"manager.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestTLSCallerIsItsServiceAccount(t *testing.T) {
	cert, pool := selfSigned(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeReviewer{review: goodReview}
	tk, err := NewTokens(TokenOptions{Review: r.Review, Audience: "fusebox-manager"})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(t, ln, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}),
		NewAuthenticator(AuthenticatorOptions{Tokens: tk, Operators: []string{"fusebox/ops"}}))
	conn := dial(t, "passthrough:///"+ln.Addr().String(), credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "manager.test"}))
	c := testgrpc.NewTestServiceClient(conn)
	token := jwt("fusebox-manager", time.Now().Add(time.Hour), "x")
	withToken := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	if _, err := c.EmptyCall(withToken, &testgrpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	if id, ok := rec.last(); !ok || id != ServiceAccountIdentity("agents", "coder") {
		t.Fatalf("identity %+v (%v)", id, ok)
	}
	// No token: refused with a message that says what to present.
	_, err = c.EmptyCall(context.Background(), &testgrpc.Empty{})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `ServiceAccount token with audience "fusebox-manager"`) {
		t.Fatalf("no token: %v", err)
	}
	s, err := c.StreamingOutputCall(context.Background(), &testgrpc.StreamingOutputCallRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream without a token: %v", err)
	}
	// An operator account is marked as one.
	r.review = Review{Authenticated: true, Username: "system:serviceaccount:fusebox:ops", Audiences: []string{"fusebox-manager"}}
	opCtx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+jwt("fusebox-manager", time.Now().Add(time.Hour), "op"))
	if _, err := c.EmptyCall(opCtx, &testgrpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	if id, _ := rec.last(); !id.Operator || id.Namespace != "fusebox" {
		t.Fatalf("operator identity %+v", id)
	}
	// Health answers without a token (probes send none).
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health without a token: %v", err)
	}
}

func TestTCPWithoutTokensOrTLSIsRefused(t *testing.T) {
	cert, pool := selfSigned(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}}), NewAuthenticator(AuthenticatorOptions{}))
	c := testgrpc.NewTestServiceClient(dial(t, "passthrough:///"+ln.Addr().String(), credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "manager.test"})))
	if _, err := c.EmptyCall(context.Background(), &testgrpc.Empty{}); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "accepts no callers over TCP") {
		t.Fatalf("TLS caller without a token authenticator: %v", err)
	}
	// A server without transport security gives its callers no AuthInfo: refused.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln2, insecure.NewCredentials(), NewAuthenticator(AuthenticatorOptions{}))
	c2 := testgrpc.NewTestServiceClient(dial(t, "passthrough:///"+ln2.Addr().String(), insecure.NewCredentials()))
	if _, err := c2.EmptyCall(context.Background(), &testgrpc.Empty{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("plaintext caller: %v", err)
	}
}

func TestStatusCodes(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code codes.Code
	}{
		{ErrUnauthenticated, codes.Unauthenticated},
		{ErrDenied, codes.PermissionDenied},
		{ErrUnavailable, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	} {
		if got := status.Code(Status(tt.err)); got != tt.code {
			t.Errorf("Status(%v) = %v, want %v", tt.err, got, tt.code)
		}
	}
}
