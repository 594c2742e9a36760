package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// AllocateOptions describe the sandbox to allocate.
type AllocateOptions struct {
	Template string
	// Egress lists the destinations the sandbox may reach ("host:port", "*.domain:port").
	// Empty: none.
	Egress []string
	// LeaseTTL: zero means the manager's default. The lease is renewed in the background.
	LeaseTTL time.Duration
	Labels   map[string]string
	// Env and Cwd are the environment variables and working directory (absolute, or relative
	// to the workspace) every command starts with, over the template's. The sandbox gets them
	// when it is initialised: a warm sandbox serves them.
	Env map[string]string
	Cwd string
	// Key is the agent key; nil generates a fresh one.
	Key *Key
	// ManagerCredentials secure the connection to the manager, replacing CAFile and
	// ServerName; nil: none on a unix socket, TLS with CAFile on tcp://.
	ManagerCredentials credentials.TransportCredentials
	// TokenFile, CAFile and ServerName: see WithTokenFile, WithCAFile and WithServerName. A
	// tcp:// manager needs CAFile (or ManagerCredentials) and TokenFile.
	TokenFile, CAFile, ServerName string
	// Sandbox tunes the data-plane connection.
	Sandbox Options
	// Trace, if set, has its hooks called at the allocation's steps on this side.
	Trace *AllocateTrace
}

// AllocateTrace is a set of hooks called at an allocation's steps on the agent's side, in the
// manner of net/http/httptrace: for finding where its time goes (fusebox-bench allocate
// --trace puts them beside the manager's and the sandbox's own). Any hook may be nil. They are called on the goroutine that reaches the step and must
// not block.
type AllocateTrace struct {
	// Answered is called when the manager's answer arrives.
	Answered func(at time.Time)
	// Connected is called once, when the first data connection is dialed, with when it was.
	Connected func(at time.Time)
}

// Allocation is a bound sandbox: the embedded Sandbox talks to it directly; Close releases it.
type Allocation struct {
	*Sandbox
	ID       string
	Endpoint string

	mgr   managerv1.ManagerClient
	owned *grpc.ClientConn // the manager connection, when this allocation made it (Allocate)
	token string
	stop  chan struct{}
	done  chan struct{}
	// key is the agent key; session the allocation's session document without it
	// (ExportSession).
	key     *Key
	session *Session

	mu       sync.Mutex // guards expires, renewErr
	expires  time.Time
	renewErr error
	closed   sync.Once
}

// Manager is a connection to a fusebox manager, for an agent that allocates many sandboxes:
// each Allocate then costs one call, not a new connection. It is safe for concurrent use.
type Manager struct {
	conn *grpc.ClientConn
	rpc  managerv1.ManagerClient
	addr string // as given to NewManager, for sessions
}

// handshake is the data-plane TLS configuration made for one allocation.
type handshake struct {
	key *Key
	pin *tlspin.Pin // the sandbox's key, set from the allocation's answer
	cfg *tls.Config
}

// newHandshake makes the data-plane TLS configuration for an allocation, with a fresh key
// when key is nil.
func newHandshake(key *Key) (*handshake, error) {
	if key == nil {
		var err error
		if key, err = NewKey(); err != nil {
			return nil, err
		}
	}
	go key.cert() // the certificate the handshake presents, made meanwhile
	h := &handshake{key: key, pin: &tlspin.Pin{}}
	h.cfg = tlspin.ClientConfigPin(key.cert, h.pin)
	return h, nil
}

// NewManager connects to the manager at addr (unix:///path or tcp://host:port). creds, if
// set, secure the connection; otherwise a unix socket needs none (file permissions guard it)
// and a tcp:// manager is reached by TLS with WithCAFile, authenticated WithTokenFile:
//
//	m, err := client.NewManager("tcp://fusebox-manager.fusebox.svc:9090", nil,
//		client.WithCAFile("/etc/fusebox/ca/ca.crt"), client.WithTokenFile("/var/run/secrets/fusebox/token"))
//
// The connection is made at once, in the background.
func NewManager(addr string, creds credentials.TransportCredentials, opts ...ManagerOption) (*Manager, error) {
	a, err := endpoint.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("manager address: %w", err)
	}
	var c managerConfig
	for _, o := range opts {
		o(&c)
	}
	dial, err := c.dialOptions(a, creds)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(a.GRPCTarget(), dial...)
	if err != nil {
		return nil, fmt.Errorf("dialing manager %s: %w", a, err)
	}
	conn.Connect()
	return &Manager{conn: conn, rpc: managerv1.NewManagerClient(conn), addr: addr}, nil
}

// Close closes the connection. Allocations made through it stop renewing their leases and
// cannot be released through it afterwards: close them first.
func (m *Manager) Close() error {
	return m.conn.Close()
}

// Allocate asks the manager at managerAddr (unix:///path or tcp://host:port) for a sandbox,
// dials it directly with pinned keys, and renews its lease in the background until Close.
// It connects to the manager for this one allocation (o.ManagerCredentials secure that
// connection); an agent that allocates repeatedly should keep a Manager instead.
func Allocate(ctx context.Context, managerAddr string, o AllocateOptions) (*Allocation, error) {
	m, err := NewManager(managerAddr, o.ManagerCredentials, WithTokenFile(o.TokenFile), WithCAFile(o.CAFile), WithServerName(o.ServerName))
	if err != nil {
		return nil, err
	}
	a, err := m.Allocate(ctx, o)
	if err != nil {
		m.Close()
		return nil, err
	}
	a.owned = m.conn
	return a, nil
}

// Allocate asks the manager for a sandbox, dials it directly with pinned keys, and renews its
// lease in the background until the allocation's Close. o.ManagerCredentials, TokenFile,
// CAFile and ServerName are not used: the Manager's connection is.
func (m *Manager) Allocate(ctx context.Context, o AllocateOptions) (*Allocation, error) {
	// The sandbox's key, pinned before the data plane's handshake, comes with the answer.
	h, err := newHandshake(o.Key)
	if err != nil {
		return nil, err
	}
	req := &managerv1.AllocateRequest{AgentPublicKey: h.key.PublicKey(), Template: o.Template, Egress: o.Egress, Labels: o.Labels,
		Env: o.Env, Cwd: o.Cwd}
	if o.LeaseTTL > 0 {
		req.LeaseTtl = durationpb.New(o.LeaseTTL)
	}
	resp, err := m.rpc.Allocate(ctx, req)
	trace := o.Trace
	if trace == nil {
		trace = &AllocateTrace{}
	}
	if trace.Answered != nil {
		trace.Answered(time.Now())
	}
	if err != nil {
		return nil, fmt.Errorf("allocating sandbox: %w", err)
	}
	a := &Allocation{ID: resp.GetSandboxId(), Endpoint: resp.GetEndpoint(), mgr: m.rpc,
		token: resp.GetLeaseToken(), stop: make(chan struct{}), done: make(chan struct{}),
		expires: resp.GetLeaseExpires().AsTime(), key: h.key, session: newSession(m.addr, resp, h.key)}
	sb, err := connect(ctx, resp, h, o.Sandbox, trace)
	if err != nil {
		a.release(context.WithoutCancel(ctx))
		return nil, err
	}
	a.Sandbox = sb
	ttl := o.LeaseTTL
	if ttl <= 0 {
		ttl = time.Until(a.expires)
	}
	go a.renew(max(ttl/3, 100*time.Millisecond))
	return a, nil
}

// connect connects to the sandbox resp describes, with a TLS handshake of h's configuration:
// a sandbox presenting a key other than the one the manager returned is refused.
func connect(ctx context.Context, resp *managerv1.AllocateResponse, h *handshake, o Options, trace *AllocateTrace) (*Sandbox, error) {
	a, err := endpoint.Parse(resp.GetEndpoint())
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: %w", err)
	}
	sandboxKey, err := tlspin.ParsePublicKey(resp.GetSandboxPublicKey())
	if err != nil {
		return nil, fmt.Errorf("dialing sandbox: sandbox key: %w", err)
	}
	if err := h.pin.Set(sandboxKey); err != nil {
		return nil, err
	}
	// endpoint.Dial never follows a link the sandbox may have put at its socket's name.
	d := connectedDialer(func(ctx context.Context) (net.Conn, error) { return endpoint.Dial(ctx, a) }, trace.Connected)
	sb, err := dial("passthrough:///"+a.String(), o,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return d(ctx) }),
		grpc.WithTransportCredentials(credentials.NewTLS(h.cfg)))
	if err != nil {
		return nil, err
	}
	sb.withBulk(a, h.cfg)
	return sb, nil
}

// connectedDialer calls connected, if set, when dial first returns a connection.
func connectedDialer(dial func(context.Context) (net.Conn, error), connected func(time.Time)) func(context.Context) (net.Conn, error) {
	if connected == nil {
		return dial
	}
	var once sync.Once
	return func(ctx context.Context) (net.Conn, error) {
		c, err := dial(ctx)
		if err == nil {
			at := time.Now()
			once.Do(func() { connected(at) })
		}
		return c, err
	}
}

func (a *Allocation) renew(every time.Duration) {
	defer close(a.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		resp, err := a.mgr.Renew(ctx, &managerv1.RenewRequest{SandboxId: a.ID, LeaseToken: a.token})
		cancel()
		a.mu.Lock()
		if err != nil {
			a.renewErr = fmt.Errorf("renewing lease of %s: %w", a.ID, err)
		} else {
			a.expires, a.renewErr = resp.GetLeaseExpires().AsTime(), nil
		}
		a.mu.Unlock()
	}
}

// LeaseExpires returns the lease's current expiry and the last renewal error, if any.
func (a *Allocation) LeaseExpires() (time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.expires, a.renewErr
}

func (a *Allocation) release(ctx context.Context) error {
	_, err := a.mgr.Release(ctx, &managerv1.ReleaseRequest{SandboxId: a.ID, LeaseToken: a.token})
	return err
}

// Renew extends the lease now, by its own length, besides the background renewals, and
// returns the new expiry. A lease the manager no longer holds is ErrLeaseNotHeld.
func (a *Allocation) Renew(ctx context.Context) (time.Time, error) {
	resp, err := a.mgr.Renew(ctx, &managerv1.RenewRequest{SandboxId: a.ID, LeaseToken: a.token})
	if err != nil {
		if leaseEnded(err) {
			return time.Time{}, fmt.Errorf("%w: sandbox %s: %w", ErrLeaseNotHeld, a.ID, err)
		}
		return time.Time{}, fmt.Errorf("renewing lease of %s: %w", a.ID, err)
	}
	exp := resp.GetLeaseExpires().AsTime()
	a.mu.Lock()
	a.expires, a.renewErr = exp, nil
	a.mu.Unlock()
	return exp, nil
}

// leaseEnded tells whether err, from Renew or Release, says the lease is not held: ended,
// unknown, or another token.
func leaseEnded(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied:
		return true
	}
	return false
}

// Close stops renewing, releases the sandbox (the manager destroys it) and closes the sandbox
// connection, and the manager connection if Allocate made it for this allocation. It is safe
// to call more than once, and after Detach it does nothing.
func (a *Allocation) Close() error {
	return a.end(true)
}

// Detach stops renewing and closes the connections, leaving the sandbox running until its
// lease expires or a holder of its session (ExportSession, Connect) releases it.
func (a *Allocation) Detach() error {
	return a.end(false)
}

func (a *Allocation) end(release bool) error {
	var err error
	a.closed.Do(func() {
		close(a.stop)
		<-a.done
		if release {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if rerr := a.release(ctx); rerr != nil {
				if leaseEnded(rerr) {
					rerr = fmt.Errorf("%w: %w", ErrLeaseNotHeld, rerr)
				}
				err = fmt.Errorf("releasing %s: %w", a.ID, rerr)
			}
		}
		err = errors.Join(err, a.Sandbox.Close())
		if a.owned != nil {
			err = errors.Join(err, a.owned.Close())
		}
	})
	return err
}
