package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

type empty struct {
	testgrpc.UnimplementedTestServiceServer
}

func (empty) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func pool(t *testing.T, caPEM []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	return p
}

func writePair(t *testing.T, dir string, names ...string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	ca, cert, key, err := Generate(names, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return ca, certFile, keyFile
}

// serveSplit serves a TLS gRPC server with src and the plaintext refusal on one listener.
func serveSplit(t *testing.T, src Source) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsLn, plainLn := Split(ln)
	hs := health.NewServer()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(ServerConfig(src))))
	testgrpc.RegisterTestServiceServer(srv, empty{})
	healthpb.RegisterHealthServer(srv, hs)
	plain := PlaintextServer(hs)
	go srv.Serve(tlsLn)
	go plain.Serve(plainLn)
	t.Cleanup(func() { plain.Stop(); srv.Stop() })
	return ln.Addr().String()
}

func call(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = testgrpc.NewTestServiceClient(conn).EmptyCall(ctx, &testgrpc.Empty{})
	return err
}

func TestSplitServesTLSAndRefusesPlaintextClearly(t *testing.T) {
	ca, certFile, keyFile := writePair(t, t.TempDir(), "fusebox-manager.fusebox.svc")
	src, err := NewFiles(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveSplit(t, src)
	good := credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca), ServerName: "fusebox-manager.fusebox.svc"})
	if err := call(t, addr, good); err != nil {
		t.Fatalf("TLS call: %v", err)
	}
	err = call(t, addr, insecure.NewCredentials())
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "this manager serves TLS only") || !strings.Contains(err.Error(), "--ca-file") {
		t.Fatalf("plaintext call: %v", err)
	}
	// The plaintext side serves health, for the kubelet's gRPC probes.
	conn, _ := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("plaintext health: %v", err)
	}
	// A client trusting another CA, or checking another name, is refused by its own TLS.
	other, _, _, _ := Generate([]string{"x"}, time.Now(), time.Hour)
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, other), ServerName: "fusebox-manager.fusebox.svc"})); status.Code(err) != codes.Unavailable {
		t.Fatalf("wrong CA: %v", err)
	}
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca), ServerName: "evil.example"})); status.Code(err) != codes.Unavailable {
		t.Fatalf("wrong name: %v", err)
	}
	// TLS 1.2 is refused.
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca), ServerName: "fusebox-manager.fusebox.svc", MaxVersion: tls.VersionTLS12})); err == nil {
		t.Fatal("TLS 1.2 accepted")
	}
}

func TestFilesReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	ca1, certFile, keyFile := writePair(t, dir, "m.test")
	src, err := NewFiles(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveSplit(t, src)
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca1), ServerName: "m.test"})); err != nil {
		t.Fatal(err)
	}
	ca2, _, _ := writePair(t, dir, "m.test")
	// Make the change visible even on a filesystem with coarse timestamps.
	later := time.Now().Add(time.Minute)
	os.Chtimes(certFile, later, later)
	os.Chtimes(keyFile, later, later)
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca2), ServerName: "m.test"})); err != nil {
		t.Fatalf("after rotation, the new CA: %v", err)
	}
	// A broken pair keeps the previous certificate.
	os.WriteFile(keyFile, []byte("garbage"), 0o600)
	os.Chtimes(keyFile, later.Add(time.Minute), later.Add(time.Minute))
	if err := call(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool(t, ca2), ServerName: "m.test"})); err != nil {
		t.Fatalf("after a broken write: %v", err)
	}
}

func TestNewFilesNamesTheMissingFile(t *testing.T) {
	_, err := NewFiles("/nonexistent/tls.crt", "/nonexistent/tls.key", nil)
	if err == nil || !strings.Contains(err.Error(), "TLS certificate file") || !strings.Contains(err.Error(), "/nonexistent/tls.crt") {
		t.Fatalf("NewFiles = %v", err)
	}
}

func TestEnsureSecretCreatesOnceAndPublishesTheCA(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	o := SecretOptions{Client: cs, Namespace: "fusebox", Name: "fusebox-manager-tls", Create: true,
		DNSNames: []string{"fusebox-manager.fusebox.svc"}, CAConfigMap: "fusebox-manager-ca"}
	a, err := EnsureSecret(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets("fusebox").Get(ctx, o.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != corev1.SecretTypeTLS || len(s.Data[KeyCA]) == 0 {
		t.Fatalf("secret %+v", s)
	}
	cm, err := cs.CoreV1().ConfigMaps("fusebox").Get(ctx, o.CAConfigMap, metav1.GetOptions{})
	if err != nil || cm.Data[KeyCA] != string(s.Data[KeyCA]) {
		t.Fatalf("CA ConfigMap %v, %v", cm, err)
	}
	// A second replica loads the same Secret rather than making another.
	b, err := EnsureSecret(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := a.GetCertificate(nil)
	cb, _ := b.GetCertificate(nil)
	if !bytes.Equal(ca.Certificate[0], cb.Certificate[0]) {
		t.Fatal("two replicas serve different certificates")
	}
	// A rotated Secret is served and its CA published.
	caPEM, certPEM, keyPEM, _ := Generate(o.DNSNames, time.Now(), time.Hour)
	s.Data = map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM, KeyCA: caPEM}
	if _, err := cs.CoreV1().Secrets("fusebox").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want, _ := tls.X509KeyPair(certPEM, keyPEM)
	for i := 0; ; i++ {
		c, _ := a.GetCertificate(nil)
		cm, _ := cs.CoreV1().ConfigMaps("fusebox").Get(ctx, o.CAConfigMap, metav1.GetOptions{})
		if bytes.Equal(c.Certificate[0], want.Certificate[0]) && cm.Data[KeyCA] == string(caPEM) {
			break
		}
		if i == 500 {
			t.Fatal("rotated Secret not loaded")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEnsureSecretWithoutCreateNamesTheSecret(t *testing.T) {
	_, err := EnsureSecret(context.Background(), SecretOptions{Client: fake.NewClientset(), Namespace: "fusebox", Name: "mine"})
	if err == nil || !strings.Contains(err.Error(), "TLS Secret fusebox/mine does not exist") {
		t.Fatalf("EnsureSecret = %v", err)
	}
}

// verifyFor checks that src's serving certificate, against the CA ConfigMap's CA, is valid for
// name (a DNS name or an IP address), as an agent's TLS client checks it.
func verifyFor(t *testing.T, ctx context.Context, cs *fake.Clientset, src *Secret, cm, name string) error {
	t.Helper()
	c, _ := src.GetCertificate(nil)
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cs.CoreV1().ConfigMaps("fusebox").Get(ctx, cm, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool(t, []byte(ca.Data[KeyCA])), DNSName: name})
	return err
}

// TestEnsureSecretCoversExternalNames: the certificate the manager makes covers the names and
// IP addresses agents outside the cluster use (a LoadBalancer's) beside the Service's; a
// Secret it made before for other names is made again for the new ones (and its new CA
// published); a Secret the manager did not make is never replaced.
func TestEnsureSecretCoversExternalNames(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	o := SecretOptions{Client: cs, Namespace: "fusebox", Name: "fusebox-manager-tls", Create: true,
		DNSNames: []string{"fusebox-manager.fusebox.svc"}, CAConfigMap: "fusebox-manager-ca"}
	before, err := EnsureSecret(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyFor(t, ctx, cs, before, o.CAConfigMap, "manager.example.com"); err == nil {
		t.Fatal("a certificate for the in-cluster name only is valid for manager.example.com")
	}
	// The stack adds the LoadBalancer's names: the next manager makes the Secret again.
	o.DNSNames = []string{"fusebox-manager.fusebox.svc", "manager.example.com", "203.0.113.7", "2001:db8::7"}
	after, err := EnsureSecret(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range o.DNSNames {
		if err := verifyFor(t, ctx, cs, after, o.CAConfigMap, name); err != nil {
			t.Errorf("certificate for %v not valid for %s: %v", o.DNSNames, name, err)
		}
	}
	if err := verifyFor(t, ctx, cs, after, o.CAConfigMap, "other.example.com"); err == nil {
		t.Error("certificate valid for a name it was not made for")
	}
	// The replica still serving the old names reloads the new Secret.
	for i := 0; verifyFor(t, ctx, cs, before, o.CAConfigMap, "manager.example.com") != nil; i++ {
		if i == 500 {
			t.Fatal("the Secret made again was not loaded by the running replica")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The user's Secret (no record of the manager making it) is kept as it is.
	caPEM, certPEM, keyPEM, _ := Generate([]string{"mine.example.com"}, time.Now(), time.Hour)
	if _, err := cs.CoreV1().Secrets("fusebox").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "fusebox"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM, KeyCA: caPEM}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.Name, o.CAConfigMap = "mine", "mine-ca"
	mine, err := EnsureSecret(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := mine.GetCertificate(nil); !bytes.Equal(c.Certificate[0], mustPair(t, certPEM, keyPEM).Certificate[0]) {
		t.Error("the user's Secret was replaced")
	}
}

func mustPair(t *testing.T, certPEM, keyPEM []byte) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEnsureSecretOwnedByTheDeployment: with an Owner, the Secret and the CA ConfigMap the
// manager creates carry it (the garbage collector takes them with the manager's Deployment);
// a Secret that exists already is not touched.
func TestEnsureSecretOwnedByTheDeployment(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	owner := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "fusebox-manager", UID: "uid-1"}
	cs := fake.NewClientset()
	o := SecretOptions{Client: cs, Namespace: "fusebox", Name: "fusebox-manager-tls", Create: true,
		DNSNames: []string{"fusebox-manager.fusebox.svc"}, CAConfigMap: "fusebox-manager-ca", Owner: owner}
	if _, err := EnsureSecret(ctx, o); err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets("fusebox").Get(ctx, o.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps("fusebox").Get(ctx, o.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, refs := range map[string][]metav1.OwnerReference{"Secret": s.OwnerReferences, "CA ConfigMap": cm.OwnerReferences} {
		if len(refs) != 1 || refs[0] != *owner {
			t.Errorf("%s owned by %v, want %v", what, refs, *owner)
		}
	}
	// Without an Owner, nothing is owned; a Secret made before keeps its owners.
	cs2 := fake.NewClientset()
	o.Client, o.Owner = cs2, nil
	if _, err := EnsureSecret(ctx, o); err != nil {
		t.Fatal(err)
	}
	if s, _ := cs2.CoreV1().Secrets("fusebox").Get(ctx, o.Name, metav1.GetOptions{}); len(s.OwnerReferences) != 0 {
		t.Errorf("Secret owned by %v without an Owner", s.OwnerReferences)
	}
}
