// Package portfwd is the wire format of port forwarding: one TCP connection to a port on the
// sandbox's loopback, carried by a connection to the data socket whose pinned TLS handshake
// negotiated the application protocol Proto instead of HTTP/2. The trust decision is the TLS
// handshake's, made exactly as for the gRPC service and bulk transfers; what follows it here is
// a header and an answer, used by the sandbox server and the Go client alike.
//
// After the handshake the agent sends a Request: a version byte (Version) and the port as a
// 4-byte big-endian number (wider than a port, so that an out-of-range one reaches the sandbox
// and is refused there with a message, like any other refusal). The sandbox answers with a
// 1-byte gRPC status code (0: connected), a 2-byte big-endian length and that many bytes of
// message (empty when connected). After a successful answer the connection carries the TCP
// connection's bytes unchanged, both ways; each side ends its direction with TLS's
// close_notify (CloseWrite), which the other passes on as a TCP half-close. A refused
// connection is closed after the answer.
package portfwd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Proto is the ALPN protocol name of a port-forwarding connection.
const Proto = "fusebox-port/1"

// Version is the Request format this package speaks.
const Version = 1

// RequestLen is the length of an encoded Request.
const RequestLen = 5

// MaxMessage bounds an answer's message.
const MaxMessage = 1024

// ErrFrame reports a header or answer that breaks the format.
var ErrFrame = errors.New("portfwd: malformed header")

// Request is what the agent asks for: a connection to Port on the sandbox's loopback.
type Request struct {
	Port uint32
}

// Append appends r's encoding to b.
func (r Request) Append(b []byte) []byte {
	return binary.BigEndian.AppendUint32(append(b, Version), r.Port)
}

// ReadRequest reads a Request. A connection that ends before it returns io.EOF if no byte of it
// came, else io.ErrUnexpectedEOF; a version other than Version returns an ErrFrame.
func ReadRequest(r io.Reader) (Request, error) {
	var b [RequestLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return Request{}, err
	}
	if b[0] != Version {
		return Request{}, fmt.Errorf("%w: version %d, this sandbox speaks %d", ErrFrame, b[0], Version)
	}
	return Request{Port: binary.BigEndian.Uint32(b[1:])}, nil
}

// CheckPort returns an error, whose message says so, for a port outside 1-65535.
func CheckPort(port int64) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d out of range 1-65535", port)
	}
	return nil
}

// WriteAnswer sends the answer for err: connected for nil, else err's gRPC code (codes.Unknown
// for an error that carries none) and its message, cut to MaxMessage bytes.
func WriteAnswer(w io.Writer, err error) error {
	code, msg := codes.OK, ""
	if err != nil {
		st, _ := status.FromError(err)
		code, msg = st.Code(), st.Message()
		if code == codes.OK {
			code = codes.Unknown
		}
	}
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	b := binary.BigEndian.AppendUint16([]byte{byte(code)}, uint16(len(msg)))
	_, werr := w.Write(append(b, msg...))
	return werr
}

// ReadAnswer reads an answer: nil for connected, a gRPC status error for a refusal, any other
// error for a connection that broke before the whole answer came (io.EOF if no byte of it
// did, else io.ErrUnexpectedEOF) or an answer that breaks the format.
func ReadAnswer(r io.Reader) error {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint16(h[1:])
	if n > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes, the limit is %d", ErrFrame, n, MaxMessage)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if c := codes.Code(h[0]); c != codes.OK {
		return status.Error(c, string(msg))
	}
	return nil
}

// Pipe copies a's bytes to b and b's to a, each direction until its source ends, and passes
// that end on as a half-close of its destination (CloseWrite: a TCP FIN, TLS's close_notify),
// so that an exchange over a half-closed connection (a request, then the reply) works. When
// one direction fails, both connections are closed, which ends the other. Pipe returns when
// both directions have ended, with the first error (nil: both ended cleanly); it does not
// close a or b otherwise.
//
// Each direction reads on one goroutine and writes on another, with up to maxPending bytes
// between them: what arrives while a write is under way leaves in the next write, whole. A
// TLS connection reads a record (at most 16 KiB) at a time, and under gVisor each write is a
// round through the sentry, so gathering them makes the writes few and large when the bytes
// come fast, while a lone small message still leaves as soon as it is read.
func Pipe(a, b net.Conn, maxPending int) error {
	errc := make(chan error, 1)
	go func() {
		err := oneWay(b, a, maxPending)
		if err != nil {
			a.Close()
			b.Close()
		}
		errc <- err
	}()
	err := oneWay(a, b, maxPending)
	if err != nil {
		a.Close()
		b.Close()
	}
	if err2 := <-errc; err == nil {
		err = err2
	}
	return err
}

// closeWriter is a connection that can end its writing side alone.
type closeWriter interface {
	CloseWrite() error
}

// readChunk is what one read of the source asks for.
const readChunk = 64 << 10

// pending is the bytes read and not yet written of one direction.
type pending struct {
	mu     sync.Mutex // guards buf, ended, failed
	cond   sync.Cond  // signalled when buf, ended or failed change
	buf    []byte
	ended  error // the source's end: io.EOF, or why reading failed
	failed bool  // the writer has stopped: reading is pointless
}

// oneWay copies src to dst until src ends, then half-closes dst: src is read on a goroutine
// of its own into p, and p written to dst on this one.
func oneWay(dst, src net.Conn, maxPending int) error {
	p := &pending{}
	p.cond.L = &p.mu
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, readChunk)
		for {
			n, err := src.Read(buf)
			p.mu.Lock()
			for n > 0 && len(p.buf)+n > maxPending && len(p.buf) > 0 && !p.failed {
				p.cond.Wait()
			}
			if p.failed {
				p.mu.Unlock()
				return
			}
			p.buf = append(p.buf, buf[:n]...)
			if err != nil {
				p.ended = err
			}
			p.cond.Signal()
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	stop := func() {
		p.mu.Lock()
		p.failed = true
		p.cond.Signal()
		p.mu.Unlock()
	}
	var out []byte
	for {
		p.mu.Lock()
		for len(p.buf) == 0 && p.ended == nil {
			p.cond.Wait()
		}
		out, p.buf = p.buf, out[:0]
		ended := p.ended
		p.cond.Signal()
		p.mu.Unlock()
		if len(out) > 0 {
			if _, err := dst.Write(out); err != nil {
				// The reader may be blocked on src: closing the connections (Pipe) ends it.
				stop()
				return fmt.Errorf("writing: %w", err)
			}
		}
		if ended == nil {
			continue
		}
		p.mu.Lock()
		left := len(p.buf)
		p.mu.Unlock()
		if left > 0 {
			continue // bytes read with the end, or just before it, still to write
		}
		<-done
		if ended != io.EOF {
			return fmt.Errorf("reading: %w", ended)
		}
		cw, ok := dst.(closeWriter)
		if !ok {
			return fmt.Errorf("ending the stream: %T cannot half-close", dst)
		}
		if err := cw.CloseWrite(); err != nil {
			return fmt.Errorf("ending the stream: %w", err)
		}
		return nil
	}
}
