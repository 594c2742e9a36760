package tlsflight

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC transport credentials for a listener that serves both ordinary
// handshakes (with cfg) and continuations of relayed ones. take returns the pending handshake
// a continuation finishes, or nil when there is none (the connection is then refused); it is
// called once per continuation.
func ServerCredentials(cfg *tls.Config, take func() *Pending) credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: credentials.NewTLS(cfg), take: take}
}

type serverCreds struct {
	credentials.TransportCredentials // ordinary handshakes, Info, Clone
	take                             func() *Pending
}

func (s *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cont, c, err := IsContinuation(raw)
	if err != nil {
		raw.Close()
		return nil, nil, fmt.Errorf("reading the first byte: %w", err)
	}
	if !cont {
		return s.TransportCredentials.ServerHandshake(c)
	}
	p := s.take()
	if p == nil {
		raw.Close()
		return nil, nil, ErrNotPending
	}
	tc, err := p.Continue(c)
	if err != nil {
		return nil, nil, fmt.Errorf("continuing a relayed handshake: %w", err)
	}
	info, err := authInfo(tc)
	if err != nil {
		return nil, nil, err
	}
	return tc, info, nil
}

func (s *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: s.TransportCredentials.Clone(), take: s.take}
}

// clientCredentials are gRPC transport credentials that make ordinary handshakes with cfg,
// except on a connection the dialer returned as established: that one is already secured
// (by Client.Finish) and is used as it is.
func clientCredentials(cfg *tls.Config) credentials.TransportCredentials {
	return &clientCreds{credentials.NewTLS(cfg)}
}

type clientCreds struct {
	credentials.TransportCredentials
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if e, ok := raw.(*established); ok {
		info, err := authInfo(e.tls)
		if err != nil {
			return nil, nil, err
		}
		return e.Conn, info, nil
	}
	return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{c.TransportCredentials.Clone()}
}

// established is a connection whose handshake Client.Finish completed, as the dialer hands
// it to clientCredentials: Conn is what gRPC reads and writes.
type established struct {
	net.Conn
	tls *tls.Conn
}

// authInfo checks what the ordinary credentials check after a handshake (ALPN chose h2, the
// only protocol either side offers) and describes the connection to gRPC.
func authInfo(tc *tls.Conn) (credentials.AuthInfo, error) {
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != "h2" {
		tc.Close()
		return nil, errors.New("tlsflight: the peer did not negotiate h2")
	}
	return credentials.TLSInfo{State: cs, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

// DialOptions are the gRPC dial options of a client connection whose first transport comes
// from first: a connection Client.Finish returned, or nil when the relayed handshake failed,
// for an ordinary handshake with cfg instead. Every later transport (after that one fails)
// dials network/address and makes an ordinary handshake. Dial a "passthrough:///" target with
// them. The gRPC connection can be set up while the relayed handshake finishes; first must
// receive a value or the first dial waits until its context ends.
func DialOptions(first <-chan *tls.Conn, network, address string, cfg *tls.Config) []grpc.DialOption {
	var taken atomic.Bool
	return []grpc.DialOption{
		grpc.WithTransportCredentials(clientCredentials(cfg)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if !taken.Swap(true) {
				select {
				case c := <-first:
					if c != nil {
						// The server's SETTINGS need not be awaited (see defaults).
						return &established{Conn: newDefaults(c), tls: c}, nil
					}
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}),
		grpc.WithNoProxy(),
	}
}
