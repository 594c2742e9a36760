package tlsflight

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// peer is one end's identity.
type peer struct {
	key  crypto.Signer
	cert tls.Certificate
}

func newPeer(t testing.TB) peer {
	t.Helper()
	k, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	c, err := tlspin.Certificate(k)
	if err != nil {
		t.Fatal(err)
	}
	return peer{k, c}
}

// listen returns a unix listener in a fresh directory and a dialer for it.
func listen(t *testing.T) (net.Listener, func() net.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, func() net.Conn {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func accept(t *testing.T, ln net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
			close(ch)
			return
		}
		ch <- c
	}()
	return ch
}

type relayed struct {
	client  *Client
	pin     *tlspin.Pin
	flight  []byte
	pending *Pending
}

// relay runs the out-of-band half: the client's hello is answered by a server presenting
// serverID and pinning agentPin.
func relay(t *testing.T, agent peer, serverID peer, agentPin crypto.PublicKey) relayed {
	t.Helper()
	ctx := context.Background()
	pin := &tlspin.Pin{}
	cl, err := StartClient(ctx, tlspin.ClientConfigPin(func() (tls.Certificate, error) { return agent.cert, nil }, pin))
	if err != nil {
		t.Fatal(err)
	}
	if h := cl.Hello(); len(h) < 100 || h[0] != recordHandshake {
		t.Fatalf("hello: %d bytes starting %x", len(h), h[:1])
	}
	scfg, err := tlspin.ServerConfigCert(serverID.cert, agentPin)
	if err != nil {
		t.Fatal(err)
	}
	flight, p, err := Answer(ctx, scfg, cl.Hello())
	if err != nil {
		t.Fatal(err)
	}
	return relayed{cl, pin, flight, p}
}

func TestRelayedHandshakeCarriesData(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox := newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, agent.key.Public())
	if err := r.pin.Set(sandbox.key.Public()); err != nil {
		t.Fatal(err)
	}
	ln, dial := listen(t)
	accepted := accept(t, ln)
	conn := dial()

	type result struct {
		c   *tls.Conn
		err error
	}
	srv := make(chan result, 1)
	go func() {
		raw := <-accepted
		cont, c, err := IsContinuation(raw)
		if err != nil || !cont {
			srv <- result{nil, errors.Join(err, errors.New("not seen as a continuation"))}
			return
		}
		tc, err := r.pending.Continue(c)
		srv <- result{tc, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ct, err := r.client.Finish(ctx, r.flight)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	if err := r.client.Connect(conn); err != nil {
		t.Fatal(err)
	}
	s := <-srv
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.c.Close()

	// Each end holds the other's pinned key, and ALPN chose h2.
	if got := ct.ConnectionState().PeerCertificates[0].PublicKey; !sandbox.key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(got) {
		t.Error("client sees the wrong server key")
	}
	if got := s.c.ConnectionState().PeerCertificates[0].PublicKey; !agent.key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(got) {
		t.Error("server sees the wrong client key")
	}
	if p := ct.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Errorf("ALPN %q", p)
	}
	// Data both ways, larger than one record.
	big := bytes.Repeat([]byte("fusebox "), 10000)
	go func() { ct.Write(big) }()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(s.c, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("server read %v", err)
	}
	if _, err := s.c.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(ct, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("client read %q %v", buf, err)
	}
	// The handshake is spent: a second connection cannot continue it.
	if _, err := r.pending.Continue(dial()); !errors.Is(err, ErrNotPending) {
		t.Errorf("second Continue: %v, want ErrNotPending", err)
	}
}

func TestWrongSandboxKeyFailsTheClient(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox, other := newPeer(t), newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, agent.key.Public())
	defer r.pending.Abort()
	if err := r.pin.Set(other.key.Public()); err != nil { // the manager lied about the key
		t.Fatal(err)
	}
	_, err := r.client.Finish(context.Background(), r.flight)
	if !errors.Is(err, tlspin.ErrPinMismatch) {
		t.Fatalf("Finish: %v, want ErrPinMismatch", err)
	}
}

func TestUnsetPinFailsTheClient(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox := newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, agent.key.Public())
	defer r.pending.Abort()
	if _, err := r.client.Finish(context.Background(), r.flight); !errors.Is(err, tlspin.ErrPinMismatch) {
		t.Fatalf("Finish without a pin: %v, want ErrPinMismatch", err)
	}
}

func TestWrongAgentKeyFailsTheServer(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox, other := newPeer(t), newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, other.key.Public()) // the sandbox pinned someone else
	r.pin.Set(sandbox.key.Public())
	ln, dial := listen(t)
	accepted := accept(t, ln)
	conn := dial()
	srv := make(chan error, 1)
	go func() {
		_, c, err := IsContinuation(<-accepted)
		if err != nil {
			srv <- err
			return
		}
		_, err = r.pending.Continue(c)
		srv <- err
	}()
	ct, err := r.client.Finish(context.Background(), r.flight)
	if err == nil {
		if err := r.client.Connect(conn); err != nil {
			t.Fatal(err)
		}
		// TLS 1.3: the client finishes before the server has checked it; the refusal
		// arrives as an alert on the first read.
		defer ct.Close()
		ct.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, rerr := ct.Read(make([]byte, 1)); rerr == nil {
			t.Error("client read succeeded on a refused connection")
		}
	}
	if err := <-srv; !errors.Is(err, tlspin.ErrPinMismatch) {
		t.Fatalf("Continue: %v, want ErrPinMismatch", err)
	}
}

func TestAnswerRefusesBadHellos(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox := newPeer(t), newPeer(t)
	scfg, err := tlspin.ServerConfigCert(sandbox.cert, agent.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	cl, err := StartClient(context.Background(), tlspin.ClientConfigPin(func() (tls.Certificate, error) { return agent.cert, nil }, &tlspin.Pin{}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Abort()
	hello := cl.Hello()
	corrupt := bytes.Clone(hello)
	corrupt[5] = 2 // a ServerHello where the ClientHello should be
	tls12 := &tls.Config{MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true}
	old, err := StartClient(context.Background(), tls12)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Abort()
	for _, tc := range []struct {
		name, hello, want string
	}{
		{"empty", "", "empty"},
		{"oversized", string(make([]byte, MaxHelloBytes+1)), "exceeds"},
		{"not a handshake record", "\x17" + string(hello[1:]), "not a TLS handshake record"},
		{"truncated", string(hello[:len(hello)/2]), "incomplete"},
		{"not a ClientHello", string(corrupt), "is not a ClientHello"},
		{"two records", string(hello) + string(hello), "bytes after the ClientHello"},
		{"SSL 2 version", string(hello[:1]) + "\x02" + string(hello[2:]), "is not TLS"},
		{"TLS 1.2 only", string(old.Hello()), "version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flight, p, err := Answer(context.Background(), scfg, []byte(tc.hello))
			if err == nil {
				p.Abort()
				t.Fatalf("accepted; flight of %d bytes", len(flight))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestAbandonedHandshakesEnd(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox := newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, agent.key.Public())
	r.client.Abort()
	r.pending.Abort()
	r.pending.Abort() // twice is harmless
	a, b := net.Pipe()
	defer b.Close()
	if _, err := r.pending.Continue(a); !errors.Is(err, ErrNotPending) {
		t.Errorf("Continue after Abort: %v", err)
	}
	if _, err := r.client.Finish(context.Background(), r.flight); err == nil {
		t.Error("Finish after Abort succeeded")
	}
}

// finished returns a relayed handshake finished offline (never connected) with the right
// keys, and its connection.
func finished(t *testing.T) (relayed, *tls.Conn) {
	t.Helper()
	agent, sandbox := newPeer(t), newPeer(t)
	r := relay(t, agent, sandbox, agent.key.Public())
	t.Cleanup(r.pending.Abort)
	r.pin.Set(sandbox.key.Public())
	ct, err := r.client.Finish(context.Background(), r.flight)
	if err != nil {
		t.Fatal(err)
	}
	return r, ct
}

// A finished handshake holds its second flight and what is written after it, and Connect
// sends all of it in one write; writes after that pass straight through.
func TestConnectSendsEverythingHeldInOneWrite(t *testing.T) {
	leakcheck.Check(t)
	r, ct := finished(t)
	if _, err := ct.Write([]byte("first request")); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	if !r.client.Sent().IsZero() {
		t.Fatal("Sent is set before Connect")
	}
	before := time.Now()
	if err := r.client.Connect(rec); err != nil {
		t.Fatal(err)
	}
	if sent := r.client.Sent(); sent.Before(before) || sent.After(time.Now()) {
		t.Errorf("Sent = %v, want the time of Connect's write", sent)
	}
	if rec.writes != 1 || rec.written.Len() < 100 {
		t.Fatalf("Connect made %d writes of %d bytes, want the held flight and request in one", rec.writes, rec.written.Len())
	}
	if _, err := ct.Write([]byte("more")); err != nil || rec.writes != 2 {
		t.Fatalf("a write after Connect: %v, %d writes", err, rec.writes)
	}
	if err := r.client.Connect(&recorder{}); err != nil || rec.writes != 2 {
		t.Fatalf("a second Connect: %v, %d writes on the first connection", err, rec.writes)
	}
}

// A finished handshake that is never connected fails its reads and writes once abandoned.
func TestAbandonedFinishedHandshakeFails(t *testing.T) {
	leakcheck.Check(t)
	r, ct := finished(t)
	read := make(chan error, 1)
	go func() { _, err := ct.Read(make([]byte, 1)); read <- err }()
	r.client.Abort()
	if err := <-read; err == nil {
		t.Error("read on an abandoned handshake succeeded")
	}
	if _, err := ct.Write([]byte("x")); err == nil {
		t.Error("write on an abandoned handshake succeeded")
	}
}

// An ordinary handshake on the same listener is told apart by its first byte and still works
// through the replayed byte.
func TestOrdinaryHandshakeIsNotAContinuation(t *testing.T) {
	leakcheck.Check(t)
	agent, sandbox := newPeer(t), newPeer(t)
	ln, dial := listen(t)
	accepted := accept(t, ln)
	scfg, _ := tlspin.ServerConfigCert(sandbox.cert, agent.key.Public())
	srv := make(chan error, 1)
	go func() {
		cont, c, err := IsContinuation(<-accepted)
		if err != nil {
			srv <- err
			return
		}
		if cont {
			srv <- errors.New("a ClientHello was taken for a continuation")
			return
		}
		tc := tls.Server(c, scfg)
		defer tc.Close()
		if err := tc.Handshake(); err != nil {
			srv <- err
			return
		}
		_, err = tc.Write([]byte("ok"))
		srv <- err
	}()
	ccfg, _ := tlspin.ClientConfigCert(agent.cert, sandbox.key.Public())
	ct := tls.Client(dial(), ccfg)
	defer ct.Close()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(ct, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("client: %q %v", buf, err)
	}
	if err := <-srv; err != nil {
		t.Fatal(err)
	}
}
