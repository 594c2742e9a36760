// Package transport secures the manager API's TCP listener: TLS 1.3 with a serving
// certificate that is reloaded when it changes (from files, or from a Kubernetes Secret the
// manager may create itself, see EnsureSecret), and a clear refusal for plaintext callers.
//
// A TCP listener is split by each connection's first byte (Split): a TLS handshake goes to
// the TLS server; anything else (a gRPC client without TLS) goes to a plaintext server that
// answers every call with UNAUTHENTICATED and a message saying what to configure, and serves
// only the gRPC health service (the kubelet's gRPC probes speak no TLS).
package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Source provides the serving certificate for each handshake.
type Source interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// ServerConfig is the TLS configuration of the manager's listener: TLS 1.3 only, the
// certificate from src.
func ServerConfig(src Source) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: src.GetCertificate, NextProtos: []string{"h2"}}
}

// Files is a Source reading a PEM certificate chain and key from files (a mounted Secret:
// tls.crt and tls.key), read again when either file changes. A change that does not load (a
// half-written pair) keeps the previous certificate until the pair loads.
type Files struct {
	cert, key string
	log       *slog.Logger

	mu    sync.Mutex // guards cur, stamp
	cur   *tls.Certificate
	stamp [2]fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.ModTime(), fi.Size()}, nil
}

// NewFiles loads the pair once (an error names the file) and returns the Source.
func NewFiles(certFile, keyFile string, log *slog.Logger) (*Files, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("transport: both a certificate and a key file are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Files{cert: certFile, key: keyFile, log: log}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Files) reload() error {
	cs, err := stampOf(f.cert)
	if err != nil {
		return fmt.Errorf("TLS certificate file: %w", err)
	}
	ks, err := stampOf(f.key)
	if err != nil {
		return fmt.Errorf("TLS key file: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil && f.stamp == [2]fileStamp{cs, ks} {
		return nil
	}
	c, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("loading TLS certificate %s and key %s: %w", f.cert, f.key, err)
	}
	if f.cur != nil {
		f.log.Info("serving certificate reloaded", "cert", f.cert)
	}
	f.cur, f.stamp = &c, [2]fileStamp{cs, ks}
	return nil
}

// GetCertificate implements Source; it checks the files' modification times on each
// handshake (two stats) and reloads them when they changed.
func (f *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if err := f.reload(); err != nil {
		f.log.Warn("keeping the previous serving certificate", "err", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur, nil
}

// PlaintextMessage is what a plaintext caller of a TLS listener is told.
const PlaintextMessage = "this manager serves TLS only: connect with TLS, trusting the manager's CA " +
	"(fusebox --ca-file or $FUSEBOX_CA_FILE; Go SDK client.WithCAFile or AllocateOptions.CAFile), " +
	"and authenticate with a ServiceAccount token (--token-file or $FUSEBOX_TOKEN_FILE)"

// PlaintextServer returns the server for the plaintext side of Split: every call but the
// health service's is refused with UNAUTHENTICATED and PlaintextMessage.
func PlaintextServer(health healthpb.HealthServer) *grpc.Server {
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return status.Error(codes.Unauthenticated, PlaintextMessage)
	}))
	healthpb.RegisterHealthServer(srv, health)
	return srv
}

// sniffTimeout bounds how long a new connection may take to send its first byte.
const sniffTimeout = 10 * time.Second

// Split splits ln by each connection's first byte: TLS handshakes (0x16) to tlsLn, the rest
// to plainLn. Closing either closes ln and both.
func Split(ln net.Listener) (tlsLn, plainLn net.Listener) {
	s := &split{ln: ln, done: make(chan struct{})}
	s.tls = &side{s: s, conns: make(chan net.Conn)}
	s.plain = &side{s: s, conns: make(chan net.Conn)}
	go s.run()
	return s.tls, s.plain
}

type split struct {
	ln         net.Listener
	tls, plain *side
	done       chan struct{}
	once       sync.Once
	errMu      sync.Mutex // guards err
	err        error
}

func (s *split) run() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.errMu.Lock()
			s.err = err
			s.errMu.Unlock()
			s.close()
			return
		}
		go s.route(c)
	}
}

func (s *split) route(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	to := s.plain
	if b[0] == 0x16 { // TLS record type handshake
		to = s.tls
	}
	select {
	case to.conns <- &prefixed{Conn: c, first: b[0], has: true}:
	case <-s.done:
		c.Close()
	}
}

func (s *split) close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
	})
	return err
}

type side struct {
	s     *split
	conns chan net.Conn
}

func (d *side) Accept() (net.Conn, error) {
	select {
	case c := <-d.conns:
		return c, nil
	case <-d.s.done:
		d.s.errMu.Lock()
		defer d.s.errMu.Unlock()
		if d.s.err != nil {
			return nil, d.s.err
		}
		return nil, net.ErrClosed
	}
}

func (d *side) Close() error   { return d.s.close() }
func (d *side) Addr() net.Addr { return d.s.ln.Addr() }

// prefixed is a connection whose first byte was read already.
type prefixed struct {
	net.Conn
	first byte
	has   bool
	mu    sync.Mutex // guards has
}

func (p *prefixed) Read(b []byte) (int, error) {
	p.mu.Lock()
	if p.has && len(b) > 0 {
		p.has = false
		p.mu.Unlock()
		b[0] = p.first
		return 1, nil
	}
	p.mu.Unlock()
	return p.Conn.Read(b)
}
