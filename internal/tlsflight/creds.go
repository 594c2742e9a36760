package tlsflight

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

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
	return newServerHold(tc), info, nil
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

// flushAfter bounds how long a finished relayed handshake is held for the first request to
// join it (see Client.Finish): the server's half of the handshake waits meanwhile.
const flushAfter = 5 * time.Millisecond

// DialOptions are the gRPC dial options of a client connection whose first transport is the
// handshake first delivers, finished (Client.Finish), or nil when the relayed handshake
// failed, for an ordinary handshake with cfg instead. dial opens connections to the server
// (NetDialer, or one that first collects a connection opened ahead: internal/handoff).
//
// The first connection is dialed when gRPC starts its first transport (call Connect on the
// connection to start it at once), while the handshake finishes: the sandbox accepts it (for
// a sandbox that was idle, a wake-up under gVisor) off the critical path. The
// finished handshake goes out on it when the first request is written, so that the server
// receives the end of the handshake and the request in one write, or after flushAfter without
// a request. first must receive a value or that transport waits until gRPC ends its context,
// as closing the connection does, which closes the connection dialed ahead; one never used is
// closed after handshakeTimeout in any case, and a connection closed before its first
// transport started has dialed nothing. Every later transport (after that one fails) dials
// and makes an ordinary handshake. Dial a "passthrough:///" target with them.
func DialOptions(first <-chan *Client, dial func(context.Context) (net.Conn, error), cfg *tls.Config) []grpc.DialOption {
	var taken atomic.Bool
	return []grpc.DialOption{
		grpc.WithTransportCredentials(clientCredentials(cfg)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if !taken.Swap(true) {
				early := dialAhead(dial)
				select {
				case c := <-first:
					if c != nil {
						return c.established(early.take), nil
					}
					return early.take(ctx)
				case <-ctx.Done():
					early.drop()
					return nil, ctx.Err()
				}
			}
			return dial(ctx)
		}),
		grpc.WithNoProxy(),
	}
}

// NetDialer returns a dial function for DialOptions that connects to address on network.
func NetDialer(network, address string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
}

// ahead is a connection dialed before it is needed. Exactly one of take and drop gets it.
type ahead struct {
	done  chan struct{} // closed when the dial has returned
	conn  net.Conn
	err   error
	timer *time.Timer // drops it unless taken in time
	mu    sync.Mutex
	ended bool // taken or dropped
}

// errDropped is take's error after drop.
var errDropped = errors.New("tlsflight: the connection dialed ahead was dropped")

// dialAhead starts dial; the connection is closed unless taken within handshakeTimeout.
func dialAhead(dial func(context.Context) (net.Conn, error)) *ahead {
	a := &ahead{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		a.conn, a.err = dial(ctx)
	}()
	a.timer = time.AfterFunc(handshakeTimeout, a.drop)
	return a
}

// take returns the connection once it is dialed (or ctx ends, which drops it).
func (a *ahead) take(ctx context.Context) (net.Conn, error) {
	select {
	case <-a.done:
	case <-ctx.Done():
		a.drop()
		return nil, ctx.Err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended {
		return nil, errDropped
	}
	a.ended = true
	a.timer.Stop()
	return a.conn, a.err
}

// drop closes the connection, when dialed, unless it was taken. It does not block.
func (a *ahead) drop() {
	go func() {
		<-a.done
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.ended {
			a.ended = true
			if a.conn != nil {
				a.conn.Close()
			}
		}
	}()
}

// established hands a finished handshake to gRPC: the server's SETTINGS need not be awaited
// (see defaults), and the held bytes go out with the first request or after flushAfter.
func (c *Client) established(dial func(context.Context) (net.Conn, error)) *established {
	var once sync.Once
	connect := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
			defer cancel()
			conn, err := dial(ctx)
			if err != nil {
				c.hold.abort(fmt.Errorf("tlsflight: dialing: %w", err))
				return
			}
			c.Connect(conn) // a failure fails the transport's reads and writes
		})
	}
	time.AfterFunc(flushAfter, connect)
	return &established{Conn: newDefaults(c.tc, connect), tls: c.tc}
}

// handshakeTimeout bounds connecting a finished relayed handshake, as gRPC's minimum connect
// timeout bounds an ordinary one.
const handshakeTimeout = 20 * time.Second
