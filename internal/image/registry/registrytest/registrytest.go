// Package registrytest runs a real OCI distribution registry for tests: Debian's
// docker-registry (the CNCF distribution registry) on a free loopback port, with htpasswd
// authentication and TLS from a CA made for the test, and a Docker config holding its
// credentials. Only tests import it.
package registrytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// User and Password are the registry's one account.
const (
	User     = "fusebox"
	Password = "s3cret-test-password"
)

// Registry is a running registry.
type Registry struct {
	// Host is 127.0.0.1:PORT.
	Host string
	// CAFile is the PEM CA that signed its certificate.
	CAFile string
	// DockerConfig is a directory whose config.json holds User and Password for Host: set
	// DOCKER_CONFIG to it.
	DockerConfig string
	cmd          *exec.Cmd
	done         chan struct{}
}

// Start runs a registry until the test ends. It skips the test when docker-registry or
// htpasswd is missing, unless CI is set: there, the test fails (.ci/run installs them).
func Start(t testing.TB) *Registry {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err == nil {
		_, err = exec.LookPath("htpasswd")
	}
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("docker-registry or htpasswd missing (Debian packages docker-registry, apache2-utils); CI runs this test")
		}
		t.Fatalf("docker-registry or htpasswd missing: install the Debian packages docker-registry and apache2-utils: %v", err)
	}
	dir := t.TempDir()
	caFile, certFile, keyFile := makeCerts(t, dir)
	out, err := exec.Command("htpasswd", "-Bbn", User, Password).Output()
	if err != nil {
		t.Fatalf("htpasswd: %v", err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	writeFile(t, htpasswd, out)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s
  secret: fusebox-test-secret
  tls:
    certificate: %s
    key: %s
auth:
  htpasswd:
    realm: fusebox-test
    path: %s
`, filepath.Join(dir, "storage"), host, certFile, keyFile, htpasswd)
	cfgFile := filepath.Join(dir, "config.yml")
	writeFile(t, cfgFile, []byte(cfg))

	r := &Registry{Host: host, CAFile: caFile, DockerConfig: filepath.Join(dir, "docker"), done: make(chan struct{})}
	if err := os.Mkdir(r.DockerConfig, 0o700); err != nil {
		t.Fatal(err)
	}
	WriteDockerConfig(t, r.DockerConfig, host, User, Password)
	log, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(bin, "serve", cfgFile)
	r.cmd.Stdout, r.cmd.Stderr = log, log
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting docker-registry: %v", err)
	}
	go func() { r.cmd.Wait(); log.Close(); close(r.done) }()
	t.Cleanup(r.Stop)

	// Ready when it answers /v2/ over TLS (401: authentication required).
	pem, _ := os.ReadFile(caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for i := 0; ; i++ {
		resp, err := c.Get("https://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return r
			}
		}
		select {
		case <-r.done:
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			t.Fatalf("docker-registry exited: %s", b)
		case <-time.After(50 * time.Millisecond):
		}
		if i > 400 {
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			t.Fatalf("docker-registry on %s not ready: %v: %s", host, err, b)
		}
	}
}

// Stop ends the registry (a registry that is down).
func (r *Registry) Stop() {
	if r.cmd.Process != nil {
		r.cmd.Process.Kill()
	}
	<-r.done
}

// WriteDockerConfig writes dir/config.json with credentials for host, as docker login does.
func WriteDockerConfig(t testing.TB, dir, host, user, password string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}})
	writeFile(t, filepath.Join(dir, "config.json"), b)
}

func writeFile(t testing.TB, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// makeCerts makes a CA and a certificate for 127.0.0.1 signed by it.
func makeCerts(t testing.TB, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fusebox test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writeFile(t, ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	writeFile(t, cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}))
	writeFile(t, key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return ca, cert, key
}

// Is reports whether s names the registry (for error checks).
func (r *Registry) Is(s string) bool { return strings.Contains(s, r.Host) }
