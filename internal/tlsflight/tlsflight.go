// Package tlsflight carries the first round trip of a TLS 1.3 handshake outside the
// connection it secures.
//
// A fusebox agent learns its sandbox's address and key from the manager's Allocate, and only
// then connects; an ordinary handshake would then cost the data connection a round trip into
// the sandbox (ClientHello out, ServerHello through Finished back) before anything else can
// happen, and that round trip wakes a sandbox that has sat idle in the pool. With tlsflight
// the agent's ClientHello travels in the Allocate request, the manager relays it to the
// sandbox in InitializeTLS (a round trip the allocation pays anyway, to an already awake
// sandbox), the sandbox's reply comes back in the Allocate response, and the data connection
// begins at the agent's second flight (Certificate, CertificateVerify, Finished).
//
// Nothing about TLS changes: crypto/tls runs both ends over a transport whose first bytes
// arrive another way, with the same messages, keys and checks as an ordinary handshake. The
// relay sees what a network observer of an ordinary handshake sees (the ClientHello and
// ServerHello in clear, the rest encrypted) and, like such an observer, can break the
// handshake but not read or forge the connection: both ends still authenticate each other's
// pinned key. A handshake that cannot be continued costs only the optimisation: the agent
// falls back to a full handshake.
package tlsflight

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// MaxHelloBytes bounds a relayed ClientHello. Go's is about 1.5 KiB (with the post-quantum
// key share); the bound leaves room for other clients and keeps the relay's messages small.
const MaxHelloBytes = 16 << 10

// recordHandshake is the TLS record type of a ClientHello, the first byte of every ordinary
// handshake. A continuation starts with the client's second flight instead: a
// change_cipher_spec record (middlebox compatibility) or an encrypted record.
const recordHandshake = 0x16

// ErrNotPending reports a connection that continues a handshake when none is pending.
var ErrNotPending = errors.New("tlsflight: no relayed handshake is pending for this connection")

// errAborted ends the reads of a handshake nobody continued.
var errAborted = errors.New("tlsflight: relayed handshake abandoned")

// splice is the transport under a tls.Conn whose first bytes travel another way. Until a
// connection is attached, reads return the bytes given in advance and then stall, and writes
// are collected; once attached, reads return the bytes given at attachment and then the
// connection's, and writes go to the connection.
//
// The TLS layer reads from one goroutine at a time and, before attachment, only its
// handshake writes: in and switched belong to the reader, out to the handshake.
type splice struct {
	late
	in       []byte
	switched bool // the reader has moved on to the attached side
	out      bytes.Buffer

	stalled   chan struct{} // closed when a read finds nothing to return before attachment
	stallOnce sync.Once

	attached   chan struct{} // closed by attach or abort; next and conn are set before
	attachOnce sync.Once
	next       []byte
	conn       net.Conn // nil after abort
}

func newSplice(in []byte) *splice {
	s := &splice{in: in, stalled: make(chan struct{}), attached: make(chan struct{})}
	s.late = late{s.joined}
	return s
}

// attach joins c (and bytes to read before c's) and reports whether it was first to join.
func (s *splice) attach(c net.Conn, next []byte) bool {
	ok := false
	s.attachOnce.Do(func() {
		s.conn, s.next, ok = c, next, true
		close(s.attached)
	})
	return ok
}

// abort fails the reads and writes waiting for an attachment, if none came.
func (s *splice) abort() { s.attach(nil, nil) }

func (s *splice) Read(p []byte) (int, error) {
	if len(s.in) == 0 && !s.switched {
		select {
		case <-s.attached:
		default:
			s.stallOnce.Do(func() { close(s.stalled) })
			<-s.attached
		}
		s.switched, s.in = true, s.next
	}
	if len(s.in) > 0 {
		n := copy(p, s.in)
		s.in = s.in[n:]
		return n, nil
	}
	if s.conn == nil {
		return 0, errAborted
	}
	return s.conn.Read(p)
}

func (s *splice) Write(p []byte) (int, error) {
	select {
	case <-s.attached:
		if s.conn == nil {
			return 0, errAborted
		}
		return s.conn.Write(p)
	default:
		return s.out.Write(p)
	}
}

func (s *splice) Close() error {
	s.abort()
	if c := s.joined(); c != nil {
		return c.Close()
	}
	return nil
}

func (s *splice) isAttached() bool {
	select {
	case <-s.attached:
		return true
	default:
		return false
	}
}

// joined returns the attached connection, nil before attachment or after abort.
func (s *splice) joined() net.Conn {
	if s.isAttached() {
		return s.conn
	}
	return nil
}

// late gives a connection joined after it is made the address and deadline methods of
// net.Conn: they act on the joined connection, and before it on nothing (the handshake's
// own context bounds that time).
type late struct{ joined func() net.Conn }

func (l late) LocalAddr() net.Addr {
	if c := l.joined(); c != nil {
		return c.LocalAddr()
	}
	return relayAddr{}
}
func (l late) RemoteAddr() net.Addr {
	if c := l.joined(); c != nil {
		return c.RemoteAddr()
	}
	return relayAddr{}
}
func (l late) SetDeadline(t time.Time) error {
	if c := l.joined(); c != nil {
		return c.SetDeadline(t)
	}
	return nil
}
func (l late) SetReadDeadline(t time.Time) error {
	if c := l.joined(); c != nil {
		return c.SetReadDeadline(t)
	}
	return nil
}
func (l late) SetWriteDeadline(t time.Time) error {
	if c := l.joined(); c != nil {
		return c.SetWriteDeadline(t)
	}
	return nil
}

type relayAddr struct{}

func (relayAddr) Network() string { return "relay" }
func (relayAddr) String() string  { return "relayed handshake" }

// firstFlight runs hs (the handshake of a tls.Conn over sp) until it has written what it can
// without a reply and waits for a read, and returns what it wrote. done receives hs's result.
func firstFlight(ctx context.Context, sp *splice, hs func(context.Context) error) ([]byte, <-chan error, error) {
	done := make(chan error, 1)
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer cancel()
		done <- hs(hctx)
	}()
	select {
	case <-sp.stalled:
		if sp.out.Len() == 0 {
			sp.abort()
			cancel()
			return nil, nil, errors.New("tlsflight: incomplete handshake message")
		}
		return sp.out.Bytes(), done, nil
	case err := <-done:
		// Finished or failed without waiting for the peer: with a lone first flight only a
		// failure can do that.
		if err == nil {
			err = errors.New("tlsflight: handshake completed without the peer")
		}
		return nil, nil, err
	case <-ctx.Done():
		sp.abort()
		cancel()
		return nil, nil, ctx.Err()
	}
}

// Client is the client side of a handshake whose first flight is relayed.
type Client struct {
	sp   *splice
	tc   *tls.Conn
	done <-chan error
	hold *held

	hello []byte
}

// StartClient begins a client handshake with cfg and returns once the ClientHello is made.
// cfg must not be changed afterwards; its peer check may depend on state set before Finish
// (the agent learns the sandbox's key with the server's flight).
func StartClient(ctx context.Context, cfg *tls.Config) (*Client, error) {
	sp := newSplice(nil)
	tc := tls.Client(sp, cfg)
	hello, done, err := firstFlight(ctx, sp, tc.HandshakeContext)
	if err != nil {
		return nil, fmt.Errorf("making ClientHello: %w", err)
	}
	return &Client{sp: sp, tc: tc, done: done, hello: hello, hold: newHeld()}, nil
}

// Hello returns the ClientHello record to relay.
func (c *Client) Hello() []byte { return c.hello }

// Finish completes the handshake, given the server's relayed flight, and returns the
// established connection. A TLS 1.3 client reads nothing after the server's flight, so this
// needs no network: the client's second flight, and everything written on the connection
// afterwards, are held until Connect sends them in one write (the server, which answers
// nothing before it has them all, then wakes once), and reads wait for Connect.
func (c *Client) Finish(ctx context.Context, flight []byte) (*tls.Conn, error) {
	if !c.sp.attach(c.hold, flight) {
		return nil, errors.New("tlsflight: handshake already finished or abandoned")
	}
	select {
	case err := <-c.done:
		if err != nil {
			c.hold.abort(err)
			c.tc.Close()
			return nil, err
		}
		return c.tc, nil
	case <-ctx.Done():
		c.hold.abort(ctx.Err())
		c.tc.Close() // ends the handshake
		<-c.done
		return nil, ctx.Err()
	}
}

// Sent returns when the finished handshake (and what was written after it) went out in one
// write, or zero before that.
func (c *Client) Sent() time.Time {
	if ns := c.hold.sent.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// OnSent has f called, once, with the time of the write that sends the finished handshake
// (see Sent). Call it before Connect.
func (c *Client) OnSent(f func(time.Time)) {
	c.hold.mu.Lock()
	defer c.hold.mu.Unlock()
	c.hold.onSent = f
}

// Connect joins a finished handshake to conn: it sends everything held in one write, and
// from then on the connection reads and writes through conn, which it owns. Only the first
// call joins; later ones return its result.
func (c *Client) Connect(conn net.Conn) error { return c.hold.connect(conn) }

// Abort abandons a handshake that will not be finished, or a finished one never connected.
func (c *Client) Abort() {
	if c.sp.attach(nil, nil) {
		<-c.done
	}
	c.hold.abort(errAborted)
}

// held is a finished client handshake's transport until Connect: writes collect, reads wait.
type held struct {
	late
	mu    sync.Mutex // guards buf, conn, err; held across the joining write to keep order
	buf   []byte
	conn  net.Conn
	err   error
	ready chan struct{} // closed once conn or err is set
	sent  atomic.Int64  // Unix ns of the joining write, once it is done

	onSent func(time.Time) // called after the joining write, if set
}

func newHeld() *held {
	h := &held{ready: make(chan struct{})}
	h.late = late{h.joined}
	return h
}

func (h *held) connect(c net.Conn) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil || h.err != nil {
		if c != h.conn {
			c.Close()
		}
		return h.err
	}
	if _, err := c.Write(h.buf); err != nil {
		c.Close()
		h.err = fmt.Errorf("tlsflight: sending the held handshake: %w", err)
		close(h.ready)
		return h.err
	}
	now := time.Now()
	h.sent.Store(now.UnixNano())
	h.buf, h.conn = nil, c
	close(h.ready)
	if h.onSent != nil {
		h.onSent(now)
	}
	return nil
}

func (h *held) abort(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil && h.err == nil {
		h.err = err
		close(h.ready)
	}
}

func (h *held) Write(p []byte) (int, error) {
	h.mu.Lock()
	switch {
	case h.err != nil:
		err := h.err
		h.mu.Unlock()
		return 0, err
	case h.conn != nil:
		c := h.conn
		h.mu.Unlock()
		return c.Write(p)
	}
	h.buf = append(h.buf, p...)
	h.mu.Unlock()
	return len(p), nil
}

func (h *held) Read(p []byte) (int, error) {
	<-h.ready
	if h.err != nil {
		return 0, h.err
	}
	return h.conn.Read(p)
}

func (h *held) Close() error {
	h.abort(net.ErrClosed)
	h.mu.Lock()
	c := h.conn
	h.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}

func (h *held) joined() net.Conn {
	select {
	case <-h.ready:
		return h.conn
	default:
		return nil
	}
}

// Pending is the server side of a relayed handshake, waiting for the connection that carries
// the client's second flight.
type Pending struct {
	sp   *splice
	tc   *tls.Conn
	done <-chan error
}

// CheckHello checks, cheaply and without a TLS stack, that hello is one TLS handshake record
// holding exactly one ClientHello: what a relay can check before it spends anything on it.
// (Answer still refuses a well-formed ClientHello that TLS 1.3 cannot answer.)
func CheckHello(hello []byte) error {
	switch {
	case len(hello) == 0:
		return errors.New("tlsflight: empty ClientHello")
	case len(hello) > MaxHelloBytes:
		return fmt.Errorf("tlsflight: ClientHello of %d bytes exceeds %d", len(hello), MaxHelloBytes)
	case hello[0] != recordHandshake:
		return fmt.Errorf("tlsflight: not a TLS handshake record (type %#x)", hello[0])
	case len(hello) < 9:
		return fmt.Errorf("tlsflight: incomplete ClientHello (%d bytes)", len(hello))
	}
	recLen := int(hello[3])<<8 | int(hello[4])
	hsLen := int(hello[6])<<16 | int(hello[7])<<8 | int(hello[8])
	switch {
	case hello[1] != 3:
		return fmt.Errorf("tlsflight: record version %d.%d is not TLS", hello[1], hello[2])
	case len(hello) < 5+recLen:
		return fmt.Errorf("tlsflight: incomplete ClientHello (%d bytes for a record of %d)", len(hello), 5+recLen)
	case len(hello) > 5+recLen:
		return fmt.Errorf("tlsflight: %d bytes after the ClientHello's record", len(hello)-5-recLen)
	case hello[5] != 1:
		return fmt.Errorf("tlsflight: handshake message type %d is not a ClientHello", hello[5])
	case 4+hsLen != recLen:
		return fmt.Errorf("tlsflight: ClientHello length %d does not fill its record of %d", hsLen, recLen)
	}
	return nil
}

// Answer runs the server side of a handshake on hello (a relayed ClientHello) with cfg until
// the server's flight is made, and returns the flight and the pending handshake. A hello that
// is malformed, incomplete, or that cfg refuses fails here.
func Answer(ctx context.Context, cfg *tls.Config, hello []byte) ([]byte, *Pending, error) {
	if err := CheckHello(hello); err != nil {
		return nil, nil, err
	}
	sp := newSplice(bytes.Clone(hello))
	tc := tls.Server(sp, cfg)
	flight, done, err := firstFlight(ctx, sp, tc.HandshakeContext)
	if err != nil {
		return nil, nil, fmt.Errorf("answering ClientHello: %w", err)
	}
	return bytes.Clone(flight), &Pending{sp: sp, tc: tc, done: done}, nil
}

// Continue completes the handshake over conn, whose first bytes are the client's second
// flight, and returns the established connection, which then owns conn. It fails on a
// handshake already continued or abandoned; on failure conn is closed. conn's deadlines bound
// the wait.
func (p *Pending) Continue(conn net.Conn) (*tls.Conn, error) {
	if !p.sp.attach(conn, nil) {
		conn.Close()
		return nil, ErrNotPending
	}
	if err := <-p.done; err != nil {
		p.tc.Close()
		return nil, err
	}
	return p.tc, nil
}

// Abort abandons the handshake if no connection has continued it.
func (p *Pending) Abort() {
	if p.sp.attach(nil, nil) {
		<-p.done
	}
}

// IsContinuation reads the first byte of conn and reports whether it starts a continuation
// (anything but a ClientHello record), returning a connection that replays the byte.
func IsContinuation(conn net.Conn) (bool, net.Conn, error) {
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		return false, nil, err
	}
	return b[0] != recordHandshake, &replay{Conn: conn, first: b[0], pending: true}, nil
}

// replay is a connection whose first byte was read ahead.
type replay struct {
	net.Conn
	first   byte
	pending bool
}

func (r *replay) Read(p []byte) (int, error) {
	if r.pending && len(p) > 0 {
		// The byte alone, without a read that could block: TLS asks again for the rest.
		r.pending = false
		p[0] = r.first
		return 1, nil
	}
	return r.Conn.Read(p)
}
