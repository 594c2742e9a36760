// Package handoff passes connections that a local manager opened ahead of time to the agents
// they are for, as file descriptors over a unix socket (SCM_RIGHTS).
//
// A sandbox in gVisor accepts a connection on its host unix socket slowly: the agent's dial,
// made as the allocation answers, was accepted about a millisecond later, on the allocation's
// critical path. The runsc allocator therefore connects to each unit's data socket when it
// creates it (the sandbox holds that one connection unread until its fuse blows) and holds the
// connection here. The allocation grants it to its agent with a one-time token; the agent
// collects it with Take and speaks TLS to the sandbox on it directly, exactly as on a
// connection of its own: the manager is out of the data path once the descriptor has passed,
// and it never reads or writes the connection.
//
// The protocol on the handoff socket: the agent writes the TokenSize-byte token; the server
// answers one byte, 1 with the connection's descriptor attached, or 0 (no such grant), and
// closes. A grant is good once.
package handoff

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
)

// TokenSize is the length of a grant's token.
const TokenSize = 32

// ioTimeout bounds one exchange on the handoff socket (a variable for tests).
var ioTimeout = 5 * time.Second

// ErrNoGrant is Take's error when the server knows no grant for the token (never granted,
// already taken, or dropped with its unit).
var ErrNoGrant = errors.New("handoff: no connection granted for this token")

// Server holds connections by unit id and hands each, once, to whoever presents the token
// granted for it. It is safe for concurrent use.
type Server struct {
	ln   *net.UnixListener
	path string
	log  *slog.Logger

	mu     sync.Mutex
	held   map[string]*held // by unit id
	closed bool
	wg     sync.WaitGroup
}

type held struct {
	conn  *net.UnixConn
	token []byte // nil until granted
}

// Listen serves a handoff socket at path, for its owner only (endpoint.Listen: a stale socket
// there, left by a previous manager, is removed; a live one is an error). log may be nil.
func Listen(path string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := endpoint.Listen(endpoint.Addr{Network: "unix", Address: path})
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	s := &Server{ln: ln.(*net.UnixListener), path: path, log: log, held: map[string]*held{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr is the socket's address as agents are given it: unix:///path.
func (s *Server) Addr() string { return "unix://" + s.path }

// Hold keeps c for unit id until it is granted and taken, or dropped; a connection held
// for id before is closed. After Close, c is closed at once.
func (s *Server) Hold(id string, c *net.UnixConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return
	}
	if h := s.held[id]; h != nil {
		h.conn.Close()
	}
	s.held[id] = &held{conn: c}
}

// Grant returns a fresh token for the connection held for unit id, replacing any earlier
// token for it; ok is false when none is held.
func (s *Server) Grant(id string) (token []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[id]
	if h == nil {
		return nil, false
	}
	h.token = make([]byte, TokenSize)
	rand.Read(h.token) // never fails (crypto/rand)
	return h.token, true
}

// Drop closes the connection held for unit id, if any, and voids its grant.
func (s *Server) Drop(id string) {
	s.mu.Lock()
	h := s.held[id]
	delete(s.held, id)
	s.mu.Unlock()
	if h != nil {
		h.conn.Close()
	}
}

// Close stops serving, removes the socket and closes every held connection.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	all := s.held
	s.held = map[string]*held{}
	s.mu.Unlock()
	err := s.ln.Close() // removes the socket file
	for _, h := range all {
		h.conn.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("handoff: accepting", "err", err)
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			if err := s.handle(c); err != nil {
				s.log.Warn("handoff: refused a request", "err", err)
			}
		}()
	}
}

// handle answers one request on c.
func (s *Server) handle(c *net.UnixConn) error {
	c.SetDeadline(time.Now().Add(ioTimeout))
	token := make([]byte, TokenSize)
	if _, err := io.ReadFull(c, token); err != nil {
		return fmt.Errorf("reading the token: %w", err)
	}
	h := s.take(token)
	if h == nil {
		c.Write([]byte{0})
		return ErrNoGrant
	}
	defer h.conn.Close() // the agent has its own descriptor now, or nobody needs it
	f, err := h.conn.File()
	if err != nil {
		c.Write([]byte{0})
		return fmt.Errorf("duplicating the held connection: %w", err)
	}
	defer f.Close()
	if _, _, err := c.WriteMsgUnix([]byte{1}, syscall.UnixRights(int(f.Fd())), nil); err != nil {
		return fmt.Errorf("passing the connection: %w", err)
	}
	return nil
}

// take removes and returns the held connection token was granted for, or nil.
func (s *Server) take(token []byte) *held {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, h := range s.held {
		if h.token != nil && subtle.ConstantTimeCompare(h.token, token) == 1 {
			delete(s.held, id)
			return h
		}
	}
	return nil
}

// Take collects the connection granted for token from the handoff socket at path. The
// connection is the caller's: nobody else reads or writes it.
func Take(ctx context.Context, path string, token []byte) (net.Conn, error) {
	if len(token) != TokenSize {
		return nil, fmt.Errorf("handoff: a token is %d bytes, not %d", TokenSize, len(token))
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	c := raw.(*net.UnixConn)
	defer c.Close()
	c.SetDeadline(time.Now().Add(ioTimeout)) // and ctx's end, deadline or cancel, ends it sooner:
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write(token); err != nil {
		return nil, fmt.Errorf("handoff: sending the token: %w", err)
	}
	var b [1]byte
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("handoff: reading the answer: %w", err)
	}
	fds, err := descriptors(oob[:oobn])
	if err != nil {
		return nil, err
	}
	if n != 1 || b[0] != 1 || len(fds) != 1 {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, ErrNoGrant
	}
	f := os.NewFile(uintptr(fds[0]), "handoff")
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("handoff: using the passed descriptor: %w", err)
	}
	return conn, nil
}

// descriptors returns the file descriptors in a control message.
func descriptors(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("handoff: parsing the control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		rights, err := syscall.ParseUnixRights(&m)
		if err != nil {
			return nil, fmt.Errorf("handoff: parsing the control message: %w", err)
		}
		fds = append(fds, rights...)
	}
	return fds, nil
}
