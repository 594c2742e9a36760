package tlsflight

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// HTTP/2 lets a client send requests straight after its connection preface, under the
// protocol's default settings until the server's SETTINGS frame arrives (RFC 9113 §3.4,
// §6.5.3). grpc-go's client instead waits for the server's SETTINGS before its first request,
// and after a relayed handshake that wait is a round trip into the sandbox of its own: the
// server can send its SETTINGS only once the client's second flight has reached it. defaults
// removes the wait without changing what either side may do: it gives the client transport an
// empty SETTINGS frame, which changes nothing (every setting keeps its default, exactly what
// the client may assume before the server's frame), and removes the client's acknowledgement
// of that frame from the stream, so the server sees the same frames as ever. The server's own
// SETTINGS arrive a moment later and apply as usual.
//
// defaults also tells when the first request has been written (its HEADERS frame), so that
// the held handshake and everything after it go to the server in one write (see
// Client.Finish): the server then finds its handshake's end, the HTTP/2 preface and the
// request together, and answers after a single wake-up.

// emptySettings is an HTTP/2 SETTINGS frame with no settings: length 0, type 0x4, no
// flags, stream 0.
var emptySettings = []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}

// settingsAck is the acknowledgement the client sends for it: type 0x4, flag ACK (0x1).
var settingsAck = [9]byte{0, 0, 0, 0x4, 0x1, 0, 0, 0, 0}

// clientPrefaceLen is the length of "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", written before any frame.
const clientPrefaceLen = 24

// defaults is a client transport connection that starts with an implicit empty SETTINGS frame
// (see above). Reads come from one goroutine at a time, as do writes.
type defaults struct {
	net.Conn
	injected int // read side: bytes of emptySettings returned

	// Write side: the stream is parsed frame by frame until the acknowledgement is removed
	// and the first HEADERS frame has passed.
	done    bool
	acked   bool   // the acknowledgement was removed
	headers bool   // a HEADERS frame has passed
	request func() // called once the first HEADERS frame is written (nil: nobody asks)
	preface int    // preface bytes still to pass
	skip    int    // payload bytes of the current frame still to pass
	head    []byte // a frame header split across writes
}

// frameHeaders is the HTTP/2 HEADERS frame type, which opens a request.
const frameHeaders = 0x1

func newDefaults(c net.Conn, request func()) *defaults {
	return &defaults{Conn: c, preface: clientPrefaceLen, request: request}
}

func (d *defaults) Read(p []byte) (int, error) {
	if d.injected < len(emptySettings) {
		// However small p is: the frame is returned in as many reads as it takes.
		n := copy(p, emptySettings[d.injected:])
		d.injected += n
		return n, nil
	}
	return d.Conn.Read(p)
}

func (d *defaults) Write(p []byte) (int, error) {
	if d.done {
		return d.Conn.Write(p)
	}
	out := make([]byte, 0, len(p))
	rest := p
	for len(rest) > 0 && !d.done {
		switch {
		case d.preface > 0:
			n := min(d.preface, len(rest))
			out, rest, d.preface = append(out, rest[:n]...), rest[n:], d.preface-n
		case d.skip > 0:
			n := min(d.skip, len(rest))
			out, rest, d.skip = append(out, rest[:n]...), rest[n:], d.skip-n
		default:
			n := min(9-len(d.head), len(rest))
			d.head, rest = append(d.head, rest[:n]...), rest[n:]
			if len(d.head) < 9 {
				break // the rest of the header comes with the next write
			}
			if !d.acked && [9]byte(d.head) == settingsAck {
				d.acked = true // dropped
			} else {
				out = append(out, d.head...)
				d.skip = int(d.head[0])<<16 | int(d.head[1])<<8 | int(d.head[2])
				if d.head[3] == frameHeaders {
					d.headers = true
				}
			}
			d.head = d.head[:0]
			// Everything after passes untouched once both are seen.
			d.done = d.acked && (d.headers || d.request == nil)
		}
	}
	out = append(out, rest...)
	if len(out) > 0 {
		if _, err := d.Conn.Write(out); err != nil {
			return 0, err
		}
	}
	if d.headers && d.request != nil {
		d.request()
		d.request = nil
	}
	return len(p), nil
}

var _ net.Conn = (*defaults)(nil)

// A server that continues a relayed handshake holds its first writes (its SETTINGS, a
// WINDOW_UPDATE, the acknowledgement of the client's SETTINGS) until the first response's
// HEADERS frame and sends them with it in one write (or after flushAfter without one). Only
// tlsflight's client continues a relayed handshake, and it does not wait for them (see
// defaults); sent at once, they would cost a write, and the client's acknowledgement of the
// server's SETTINGS would reach the sandbox while it serves the first request, another
// wake-up inside gVisor on the first call's path. Held, that acknowledgement comes after the
// response.

// maxServerHold bounds the bytes held.
const maxServerHold = 64 << 10

// serverHold is a server transport connection whose first writes are held (see above).
// Writes come from one goroutine at a time; the flush timer may run concurrently.
type serverHold struct {
	net.Conn
	done   atomic.Bool // nothing is held any more: writes pass straight through
	mu     sync.Mutex  // guards the fields below, and is held across the flushing write
	buf    []byte
	parsed int // bytes of buf parsed, at a frame boundary
	timer  *time.Timer
	err    error
}

func newServerHold(c net.Conn) *serverHold { return &serverHold{Conn: c} }

func (h *serverHold) Write(p []byte) (int, error) {
	if h.done.Load() {
		return h.Conn.Write(p)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return 0, h.err
	}
	if h.done.Load() {
		return h.Conn.Write(p)
	}
	h.buf = append(h.buf, p...)
	if h.headersHeld() || len(h.buf) >= maxServerHold {
		if err := h.flushLocked(); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if h.timer == nil {
		h.timer = time.AfterFunc(flushAfter, h.flush)
	}
	return len(p), nil
}

// headersHeld reports whether a HEADERS frame starts in buf.
func (h *serverHold) headersHeld() bool {
	for h.parsed+9 <= len(h.buf) {
		head := h.buf[h.parsed : h.parsed+9]
		if head[3] == frameHeaders {
			return true
		}
		h.parsed += 9 + (int(head[0])<<16 | int(head[1])<<8 | int(head[2]))
	}
	return false
}

// flushLocked sends what is held and ends holding.
func (h *serverHold) flushLocked() error {
	if h.timer != nil {
		h.timer.Stop()
	}
	buf := h.buf
	h.buf = nil
	if len(buf) > 0 {
		if _, err := h.Conn.Write(buf); err != nil {
			h.err = err
			return err
		}
	}
	h.done.Store(true)
	return nil
}

func (h *serverHold) flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done.Load() && h.err == nil {
		h.flushLocked()
	}
}

// Close sends what is held, then closes.
func (h *serverHold) Close() error {
	h.flush()
	return h.Conn.Close()
}

var _ net.Conn = (*serverHold)(nil)
