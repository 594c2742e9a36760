package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// DefaultBatchBytes is the largest WriteFiles or ReadFiles batch the client builds: gRPC's
// default 4 MiB message limit minus room for framing and metadata.
const DefaultBatchBytes = 3.5 * (1 << 20)

// Options tune a Sandbox connection. The zero value is good, and it is what fusebox-bench
// dataplane's published figures use: Dial and Allocate (Manager.Allocate) make the same gRPC
// transport from it (HTTP/2 windows of 8 MiB per stream and 16 MiB per connection, 32 KiB
// read and write buffers, messages up to a batch plus 1 MiB), so a client with default
// options sees the benchmark's figures for the same workload. Allocate differs only in how
// the connection starts: the TLS handshake rides on the allocation, which saves the first
// call a round trip and changes nothing after it.
//
// The benchmark also reports figures labelled "tuned" with Concurrency 8 (docs/performance.md,
// "Data-plane workloads"): more batches in flight only help when the sandbox has more CPUs to
// write them with.
type Options struct {
	// BatchBytes caps one batch (default DefaultBatchBytes, which fits gRPC's default 4 MiB
	// message limit with room for framing). Larger batches mean fewer RPCs but a longer wait
	// before the sandbox starts writing; smaller ones the opposite.
	BatchBytes int
	// Concurrency bounds the batches and streams in flight for one call (default 4).
	Concurrency int
	// NoBulk moves large files (WriteFileFrom, ReadFileTo, and the files of WriteFiles and
	// ReadFiles too large for a batch) with the gRPC streams WriteFileStream and
	// ReadFileStream instead of bulk connections (see BulkRequest in the sandbox service):
	// the same results, more slowly. Without it, a sandbox server that does not offer bulk
	// transfers gets the gRPC streams anyway.
	NoBulk bool
}

// Sandbox is a connection to one sandbox's data plane. It is safe for concurrent use.
type Sandbox struct {
	conn *grpc.ClientConn
	rpc  sandboxv1.SandboxClient
	opts Options
	bulk *bulkPool // nil with Options.NoBulk
	// ports makes the connections of DialPort and ForwardPort.
	ports *portDialer
}

// Dial connects to the sandbox at addr (unix:///path or tcp://host:port), accepting only a
// server that presents sandboxKey (DER SubjectPublicKeyInfo, as the manager returned it) and
// authenticating with key. The connection is made lazily; a wrong key surfaces as an
// Unavailable error on the first call.
func Dial(addr string, sandboxKey []byte, key *Key, opts ...Options) (*Sandbox, error) {
	if key == nil {
		return nil, errors.New("dialing sandbox: an agent key is required")
	}
	a, err := endpoint.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: %w", err)
	}
	pinned, err := tlspin.ParsePublicKey(sandboxKey)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: sandbox key: %w", err)
	}
	cert, err := key.cert()
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: %w", err)
	}
	cfg, err := tlspin.ClientConfigCert(cert, pinned)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: %w", err)
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	sb, err := dial(a.GRPCTarget(), o, append(unixNoFollow(a), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
	if err != nil {
		return nil, err
	}
	sb.withBulk(a, cfg)
	return sb, nil
}

// withBulk gives s its bulk connections to a, pinned by cfg, unless its options say not to,
// and its port-forwarding connections, pinned the same way.
func (s *Sandbox) withBulk(a endpoint.Addr, cfg *tls.Config) {
	// endpoint.Dial never follows a link the sandbox may have put at its socket's name.
	dial := func(ctx context.Context) (net.Conn, error) { return endpoint.Dial(ctx, a) }
	if !s.opts.NoBulk {
		s.bulk = newBulkPool(dial, cfg)
	}
	s.ports = newPortDialer(dial, cfg)
}

// unixNoFollow returns, for a unix socket address, the dial option that connects through
// endpoint.Dial, which never follows a link the sandbox may have put at its socket's name
// (TCP addresses keep gRPC's own dialer).
func unixNoFollow(a endpoint.Addr) []grpc.DialOption {
	if a.Network != "unix" {
		return nil
	}
	return []grpc.DialOption{grpc.WithContextDialer(a.DialContext)}
}

// dial makes the Sandbox: a gRPC connection to target with the given security options,
// started at once.
func dial(target string, o Options, security ...grpc.DialOption) (*Sandbox, error) {
	if o.BatchBytes <= 0 {
		o.BatchBytes = DefaultBatchBytes
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	conn, err := grpc.NewClient(target, append(security,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.BatchBytes+(1<<20)), grpc.MaxCallSendMsgSize(o.BatchBytes+(1<<20))),
		grpc.WithInitialWindowSize(8<<20),
		grpc.WithInitialConnWindowSize(16<<20),
		// gRPC's default 32 KiB read and write buffers: the read buffer is allocated afresh
		// for each connection, and a larger one was much of the memory an allocation made
		// (the agent's garbage, so its GC, which shows in the allocation's tail); streams and
		// batches move as fast with 32 KiB (fusebox-bench dataplane).
		grpc.WithReadBufferSize(32<<10),
		grpc.WithWriteBufferSize(32<<10),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox %s: %w", target, err)
	}
	conn.Connect()
	return &Sandbox{conn: conn, rpc: sandboxv1.NewSandboxClient(conn), opts: o}, nil
}

// Close closes the connections. The sandbox keeps running until its manager destroys it.
func (s *Sandbox) Close() error {
	if s.bulk != nil {
		s.bulk.close()
	}
	return s.conn.Close()
}

// RPC returns the raw generated client, for calls this package does not wrap.
func (s *Sandbox) RPC() sandboxv1.SandboxClient { return s.rpc }
