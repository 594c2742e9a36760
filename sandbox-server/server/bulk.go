package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/bulk"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Bulk transfers (package internal/bulk): a data connection whose TLS handshake negotiated
// bulk.Proto is taken out of gRPC after the handshake and served here, one exchange after
// another. The handshake is the gRPC service's own (the same configuration and pin), so a bulk
// connection is the pinned agent's as much as a gRPC one; what it saves is HTTP/2's framing,
// flow control and per-frame hand-offs between goroutines, and protobuf's copies of the bytes.
// Each transfer runs on two goroutines, the connection's side and the file's, so that under
// gVisor a read or write of the socket overlaps one of the file.

// bulkIdle is how long a bulk connection may wait for its next request. Clients keep an idle
// connection for less (client.bulkIdle).
const bulkIdle = 5 * time.Minute

// bulkDepth is how many chunks a transfer has in flight between its two goroutines.
const bulkDepth = 3

// serveBulk serves bulk exchanges on conn until the agent closes it, an exchange fails, the
// connection idles for bulkIdle, or ctx ends; it closes conn.
func (s *Server) serveBulk(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	// A timer, not a read deadline: gRPC clears the connection's deadlines after its
	// handshake returns, which may be after this has begun to read.
	idle := time.AfterFunc(bulkIdle, func() { conn.Close() })
	defer idle.Stop()
	for {
		idle.Reset(bulkIdle)
		var req sandboxv1.BulkRequest
		if err := bulk.ReadMsg(conn, &req); err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Debug("bulk connection ended", "err", err)
			}
			return
		}
		idle.Stop()
		var ok bool
		switch op := req.GetOp().(type) {
		case *sandboxv1.BulkRequest_Write:
			ok = s.bulkWrite(ctx, conn, op.Write)
		case *sandboxv1.BulkRequest_Read:
			ok = s.bulkRead(ctx, conn, op.Read)
		default:
			sendStatus(conn, errors.Join(errInvalid, errors.New("bulk request without an operation")), 0)
		}
		if !ok {
			return
		}
	}
}

// sendStatus sends the BulkStatus for err (nil: OK) and n, with the code the gRPC service
// would have returned (toStatus), and reports whether it was sent.
func sendStatus(conn net.Conn, err error, n uint64) bool {
	st, _ := status.FromError(toStatus(err))
	return bulk.WriteMsg(conn, &sandboxv1.BulkStatus{Code: int32(st.Code()), Message: st.Message(), Bytes: n}) == nil
}

// chunks fills buffers on a goroutine of its own while the caller consumes them: the two
// sides of a transfer, the socket's and the file's, overlap with len(bufs) chunks in flight.
type chunks struct {
	free, full chan []byte
	ended      chan error // fill's last error (io.EOF at a clean end), once full is closed
}

// startChunks runs fill on each free buffer until it returns an error or ctx ends; fill
// returns the part of the buffer it filled (nil for none) and, with the last, its error.
func startChunks(ctx context.Context, bufs [][]byte, fill func(buf []byte) ([]byte, error)) *chunks {
	c := &chunks{free: make(chan []byte, len(bufs)), full: make(chan []byte, len(bufs)), ended: make(chan error, 1)}
	for _, b := range bufs {
		c.free <- b
	}
	go func() {
		defer close(c.full)
		for {
			var buf []byte
			select {
			case buf = <-c.free:
			case <-ctx.Done():
				c.ended <- ctx.Err()
				return
			}
			b, err := fill(buf)
			if b != nil {
				c.full <- b // never blocks: full has room for every buffer
			}
			if err != nil {
				c.ended <- err
				return
			}
		}
	}()
	return c
}

// next returns the next filled chunk, or nil and fill's last error after the last.
func (c *chunks) next() ([]byte, error) {
	if b, ok := <-c.full; ok {
		return b, nil
	}
	return nil, <-c.ended
}

// done hands a consumed chunk's buffer back to be filled again.
func (c *chunks) done(b []byte) { c.free <- b[:cap(b)] }

// bulkWrite is WriteFileStream over conn: the chunks are read from the connection on one
// goroutine and written to the file on this one. It reports whether the connection may take
// another request.
func (s *Server) bulkWrite(ctx context.Context, conn net.Conn, hdr *sandboxv1.WriteFileHeader) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bufs := make([][]byte, bulkDepth)
	for i := range bufs {
		bufs[i] = make([]byte, bulk.MaxChunk)
	}
	in := startChunks(ctx, bufs, func(buf []byte) ([]byte, error) { return bulk.ReadChunk(conn, buf) })
	var held []byte // the chunk WriteStream is writing; handed back on the next call
	next := func() ([]byte, error) {
		if held != nil {
			in.done(held)
			held = nil
		}
		b, err := in.next()
		if err != nil && err != io.EOF {
			err = fmt.Errorf("receiving: %w", err)
		}
		held = b
		return b, err
	}
	n, err := s.opts.Workspace.WriteStream(ctx, hdr, next)
	if err != nil {
		// The status goes out even while the reader still reads: the agent stops sending
		// when it sees it, and the connection is closed after it.
		sendStatus(conn, err, 0)
		return false
	}
	return sendStatus(conn, nil, n)
}

// bulkRead is ReadFileStream over conn: the file is read on one goroutine and the chunks are
// written to the connection on this one. It reports whether the connection may take another
// request.
func (s *Server) bulkRead(ctx context.Context, conn net.Conn, req *sandboxv1.ReadFileStreamRequest) bool {
	r, err := s.opts.Workspace.OpenStream(req)
	if err != nil {
		sendStatus(conn, err, 0)
		return false
	}
	defer r.Close()
	if !sendStatus(conn, nil, uint64(r.Size())) {
		return false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A small file gets one small buffer; a large one bulkDepth full-size ones.
	size := int(max(1, min(bulk.MaxChunk, r.Left())))
	bufs := make([][]byte, max(1, min(bulkDepth, (r.Left()+bulk.MaxChunk-1)/bulk.MaxChunk)))
	for i := range bufs {
		bufs[i] = bulk.NewChunk(size)
	}
	out := startChunks(ctx, bufs, func(buf []byte) ([]byte, error) {
		n, err := io.ReadFull(r, bulk.Data(buf))
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		if n == 0 {
			return nil, err
		}
		return bulk.Frame(buf, n), err
	})
	var sent uint64
	for {
		frame, err := out.next()
		if err != nil {
			// The end, clean (io.EOF) or not: the empty chunk, then the status; the
			// connection takes another request only after a clean one.
			if err == io.EOF {
				err = nil
			}
			if _, werr := conn.Write(bulk.EndChunk); werr != nil {
				return false
			}
			return sendStatus(conn, err, sent) && err == nil
		}
		if _, err := conn.Write(frame); err != nil {
			return false // the agent has gone: nothing more can be said
		}
		sent += uint64(len(frame) - bulk.ChunkHeaderLen)
		out.done(frame)
	}
}
