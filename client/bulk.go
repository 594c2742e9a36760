package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/bulk"
	"github.com/fusebox-dev/fusebox/internal/coalesce"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Bulk transfers (internal/bulk): WriteFileFrom and ReadFileTo, and so the large files of
// WriteFiles and ReadFiles, move their bytes over a connection of their own to the sandbox's
// data socket, with the same pinned TLS 1.3 handshake as the gRPC connection but the
// application protocol bulk.Proto instead of HTTP/2, which spares the bytes HTTP/2's framing
// and flow control and protobuf's copies. A sandbox server that does not offer it refuses the
// handshake; the Sandbox then uses the gRPC streams, which mean the same, for good.

// bulkIdle is how long an idle bulk connection is kept for the next transfer: less than the
// server keeps one waiting (its bulkIdle), so that a kept connection is never one the server
// has closed.
const bulkIdle = time.Minute

// maxIdleBulk is how many idle bulk connections a Sandbox keeps.
const maxIdleBulk = 2

// errNoBulk reports that no bulk connection could be made: the transfer has not started and
// goes through gRPC instead.
var errNoBulk = errors.New("no bulk connection")

// bulkPool makes and keeps one sandbox's bulk connections. It is safe for concurrent use.
type bulkPool struct {
	dial func(context.Context) (net.Conn, error) // a raw connection to the data socket
	cfg  *tls.Config                             // the pinned configuration, offering bulk.Proto only
	off  atomic.Bool                             // the server refused a bulk handshake

	mu     sync.Mutex // guards idle and closed
	idle   []idleConn
	closed bool
}

type idleConn struct {
	c     net.Conn
	since time.Time
}

// newBulkPool returns the pool for a sandbox dialed with dial and pinned by cfg (an agent's
// tlspin configuration, which is cloned).
func newBulkPool(dial func(context.Context) (net.Conn, error), cfg *tls.Config) *bulkPool {
	c := cfg.Clone()
	c.NextProtos = []string{bulk.Proto}
	return &bulkPool{dial: dial, cfg: c}
}

// get returns a kept connection or a new one; errNoBulk when none could be made.
func (p *bulkPool) get(ctx context.Context) (net.Conn, error) {
	if p.off.Load() {
		return nil, errNoBulk
	}
	now := time.Now()
	p.mu.Lock()
	for len(p.idle) > 0 {
		ic := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if now.Sub(ic.since) < bulkIdle {
			p.mu.Unlock()
			return ic.c, nil
		}
		ic.c.Close()
	}
	p.mu.Unlock()
	raw, err := p.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoBulk, err)
	}
	// Below TLS: reads ahead on a goroutine of its own (readAhead), and each chunk's records
	// in one write into a send buffer of up to 4 MiB (as far as the host's net.core.wmem_max
	// allows), so that the sandbox, for which every read is a round through gVisor's sentry,
	// finds much to read at once (docs/performance.md).
	if u, ok := raw.(interface{ SetWriteBuffer(int) error }); ok {
		u.SetWriteBuffer(4 << 20) // best effort: a smaller buffer is only slower
	}
	ra := newReadAhead(raw)
	b := coalesce.Under(ra)
	c := tls.Client(b, p.cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		ra.Close()
		if !errors.Is(err, tlspin.ErrPinMismatch) && ctx.Err() == nil {
			// A server without bulk transfers (its ALPN refusal), or one that cannot make
			// the handshake for another reason: the gRPC connection will say which.
			p.off.Store(true)
		}
		return nil, fmt.Errorf("%w: %w", errNoBulk, err)
	}
	return coalesce.Over(c, b), nil
}

// put keeps c for the next transfer.
func (p *bulkPool) put(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleBulk {
		c.Close()
		return
	}
	p.idle = append(p.idle, idleConn{c, time.Now()})
}

// close closes the kept connections; transfers in flight end with their own.
func (p *bulkPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, ic := range p.idle {
		ic.c.Close()
	}
	p.idle = nil
}

// exchange runs one transfer on a connection from the pool: do's error decides whether the
// connection is kept (nil) or closed. ctx's end closes the connection and becomes the error.
func (p *bulkPool) exchange(ctx context.Context, do func(net.Conn) error) error {
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	err = do(c)
	if !stop() || ctx.Err() != nil {
		c.Close()
		return status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		c.Close()
		return err
	}
	p.put(c)
	return nil
}

// transportErr is the error of a broken bulk connection, as gRPC reports one.
func transportErr(doing string, err error) error {
	return status.Errorf(codes.Unavailable, "bulk connection: %s: %v", doing, err)
}

// write is WriteFileStream over a bulk connection (see the sandbox service's BulkRequest).
func (p *bulkPool) write(ctx context.Context, hdr *sandboxv1.WriteFileHeader, r io.Reader) (int64, error) {
	var written int64
	err := p.exchange(ctx, func(c net.Conn) error {
		if err := bulk.WriteMsg(c, &sandboxv1.BulkRequest{Op: &sandboxv1.BulkRequest_Write{Write: hdr}}); err != nil {
			return transportErr("sending the request", err)
		}
		// The sandbox answers at the end, or early with an error; either way it is read here.
		answer := make(chan error, 1)
		var st sandboxv1.BulkStatus
		go func() { answer <- bulk.ReadMsg(c, &st) }()
		answered := func(err error) error {
			if err != nil {
				return transportErr("reading the answer", err)
			}
			if err := bulk.Err(&st); err != nil {
				return err
			}
			written = int64(st.GetBytes())
			return nil
		}
		buf := bulk.NewChunk(bulk.MaxChunk)
		for {
			select {
			case err := <-answer:
				if err := answered(err); err != nil {
					return err
				}
				return transportErr("sending", errors.New("the sandbox answered before the end of the file"))
			default:
			}
			n, rerr := io.ReadFull(r, bulk.Data(buf))
			if n > 0 {
				if _, err := c.Write(bulk.Frame(buf, n)); err != nil {
					return refused(answer, answered, err)
				}
			}
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				break
			}
			if rerr != nil {
				return fmt.Errorf("reading source: %w", rerr) // the connection is closed: no file
			}
		}
		if _, err := c.Write(bulk.EndChunk); err != nil {
			return refused(answer, answered, err)
		}
		return answered(<-answer)
	})
	return written, err
}

// refused is the error of a write to a bulk connection that failed: the sandbox's answer when
// it sent one before it closed the connection (an early error), else the write's.
func refused(answer <-chan error, answered func(error) error, werr error) error {
	select {
	case err := <-answer:
		if err == nil {
			return answered(nil)
		}
	case <-time.After(time.Second):
	}
	return transportErr("sending", werr)
}

// read is ReadFileStream over a bulk connection, into w.
func (p *bulkPool) read(ctx context.Context, req *sandboxv1.ReadFileStreamRequest, w io.Writer) error {
	return p.exchange(ctx, func(c net.Conn) error {
		if err := bulk.WriteMsg(c, &sandboxv1.BulkRequest{Op: &sandboxv1.BulkRequest_Read{Read: req}}); err != nil {
			return transportErr("sending the request", err)
		}
		var st sandboxv1.BulkStatus
		if err := bulk.ReadMsg(c, &st); err != nil {
			return transportErr("reading the answer", err)
		}
		if err := bulk.Err(&st); err != nil {
			return err
		}
		n, err := receive(c, w, st.GetBytes())
		if err != nil {
			return err
		}
		if err := bulk.ReadMsg(c, &st); err != nil {
			return transportErr("reading the answer", err)
		}
		if err := bulk.Err(&st); err != nil {
			return err
		}
		if n != st.GetBytes() {
			return transportErr("receiving", fmt.Errorf("%d bytes arrived, the sandbox says it sent %d", n, st.GetBytes()))
		}
		return nil
	})
}

// receiveDepth is how many chunks a download has in flight between the connection and the
// destination.
const receiveDepth = 3

// chunkPool holds full-size chunk buffers between downloads.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, bulk.MaxChunk); return &b }}

// receive reads a file's chunks from c, up to the empty chunk, and writes them to w, and
// returns how many bytes it received. size is the file's size as the sandbox announced it: a
// file of more than one chunk is written to w on a goroutine of its own, so that w's writes
// (a disk, a comparison) overlap the decryption of the next chunks instead of taking turns
// with it. w has been given its last byte when receive returns.
func receive(c net.Conn, w io.Writer, size uint64) (uint64, error) {
	if size <= bulk.MaxChunk {
		return receiveInline(c, w, make([]byte, max(1, size)))
	}
	bufs := make([]*[]byte, receiveDepth)
	free, full := make(chan []byte, receiveDepth), make(chan []byte, receiveDepth)
	for i := range bufs {
		bufs[i] = chunkPool.Get().(*[]byte)
		free <- *bufs[i]
	}
	failed := make(chan struct{}) // closed when a write to w has failed
	written := make(chan error, 1)
	go func() {
		var err error
		for b := range full {
			if err == nil {
				if _, err = w.Write(b); err != nil {
					close(failed)
				}
			}
			free <- b[:cap(b)] // never blocks: free has room for every buffer
		}
		written <- err
	}()
	var n uint64
	rerr := func() error {
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-failed:
				return nil // the writer's error is the one to report
			}
			b, err := bulk.ReadChunk(c, buf)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return transportErr("receiving", err)
			}
			n += uint64(len(b))
			full <- b // never blocks: full has room for every buffer
		}
	}()
	close(full)
	werr := <-written
	// Every buffer is back in free and the writer has ended: none is used after this.
	for _, b := range bufs {
		chunkPool.Put(b)
	}
	if rerr != nil {
		return n, rerr
	}
	return n, werr
}

// receiveInline is receive for a file of one chunk or none, into buf.
func receiveInline(c net.Conn, w io.Writer, buf []byte) (uint64, error) {
	var n uint64
	for {
		b, err := bulk.ReadChunk(c, buf)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, transportErr("receiving", err)
		}
		n += uint64(len(b))
		if _, err := w.Write(b); err != nil {
			return n, err
		}
	}
}

// readAhead is a connection read ahead of TLS on a goroutine of its own, into a few buffers:
// the socket is emptied as soon as bytes arrive, whatever TLS and the destination are doing
// meanwhile. Out of gVisor the sandbox's writes have only the host socket's default send
// buffer in flight (the sandbox cannot enlarge it), some 200 KiB; a reader that decrypts and
// hands over a chunk before it reads again leaves the sandbox waiting on a full socket for
// that long, every 200 KiB. The bytes reach TLS unchanged and in order; reads gathered in
// large buffers also spare TLS a system call per record. It is read by one goroutine at a
// time (TLS's reader).
type readAhead struct {
	net.Conn
	free, full chan []byte
	stop       chan struct{} // closed by Close: the reading goroutine ends
	stopOnce   sync.Once
	err        error // the read error after the last full buffer; set before full is closed

	cur, curBuf []byte // the unread part of the buffer being consumed, and that buffer
}

// Read-ahead buffers: aheadBufs of aheadBuf bytes, made when first needed, so that an idle
// connection holds one.
const (
	aheadBufs = 8
	aheadBuf  = 256 << 10
)

func newReadAhead(raw net.Conn) *readAhead {
	r := &readAhead{Conn: raw, free: make(chan []byte, aheadBufs), full: make(chan []byte, aheadBufs), stop: make(chan struct{})}
	for range aheadBufs {
		r.free <- nil
	}
	go r.fill()
	return r
}

// fill reads the connection into free buffers until a read fails or Close.
func (r *readAhead) fill() {
	defer close(r.full)
	for {
		var b []byte
		select {
		case b = <-r.free:
		case <-r.stop:
			r.err = net.ErrClosed
			return
		}
		if b == nil {
			b = make([]byte, aheadBuf)
		}
		n, err := r.Conn.Read(b)
		if n > 0 {
			r.full <- b[:n] // never blocks: full has room for every buffer
		} else {
			r.free <- b
		}
		if err != nil {
			r.err = err
			return
		}
	}
}

func (r *readAhead) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		if r.curBuf != nil {
			r.free <- r.curBuf[:cap(r.curBuf)] // never blocks: free has room for every buffer
			r.curBuf = nil
		}
		b, ok := <-r.full
		if !ok {
			return 0, r.err
		}
		r.cur, r.curBuf = b, b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close closes the connection and ends the reading goroutine.
func (r *readAhead) Close() error {
	r.stopOnce.Do(func() { close(r.stop) })
	return r.Conn.Close()
}
