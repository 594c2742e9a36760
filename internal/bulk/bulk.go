// Package bulk is the wire format of the data plane's bulk transfers: one large file into or
// out of a sandbox over a connection whose pinned TLS handshake negotiated the application
// protocol Proto instead of HTTP/2 (see BulkRequest in proto/fusebox/sandbox/v1). The trust
// decision is the TLS handshake's, made exactly as for the gRPC service; what follows it here
// is framing, used by the sandbox server and the Go client alike.
//
// A control message is a 4-byte big-endian length and that many bytes of protobuf; a chunk
// is a 4-byte big-endian length and that many bytes of file data, a zero length ending the
// file. Chunk buffers carry their header in front (ChunkHeaderLen bytes), so that a chunk
// leaves in one write of the TLS connection.
package bulk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Proto is the ALPN protocol name of a bulk connection.
const Proto = "fusebox-bulk/1"

const (
	// ChunkHeaderLen is the length of a chunk's header.
	ChunkHeaderLen = 4
	// MaxChunk is the largest chunk either side sends or accepts: large enough that a
	// chunk's header and its write cost nothing beside its bytes, small enough to keep a few
	// in flight.
	MaxChunk = 1 << 20
	// maxControl bounds a control message.
	maxControl = 64 << 10
)

// ErrFrame reports a frame that breaks the format: the connection cannot be used further.
var ErrFrame = errors.New("bulk: malformed frame")

// WriteMsg writes m as a control message.
func WriteMsg(w io.Writer, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("bulk: encoding %T: %w", m, err)
	}
	if len(b) > maxControl {
		return fmt.Errorf("%w: %T of %d bytes, the limit is %d", ErrFrame, m, len(b), maxControl)
	}
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	_, err = w.Write(append(out, b...))
	return err
}

// ReadMsg reads a control message into m. A connection that ends before it returns io.EOF
// if no byte of it came, else io.ErrUnexpectedEOF.
func ReadMsg(r io.Reader, m proto.Message) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > maxControl {
		return fmt.Errorf("%w: control message of %d bytes, the limit is %d", ErrFrame, n, maxControl)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return noEOF(err)
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: %T: %w", ErrFrame, m, err)
	}
	return nil
}

// NewChunk returns a buffer for a chunk of up to size bytes of data, with room for its header
// in front: fill Data(buf), then send Frame(buf, n).
func NewChunk(size int) []byte { return make([]byte, ChunkHeaderLen+size) }

// Data is the part of a chunk buffer that holds the data.
func Data(buf []byte) []byte { return buf[ChunkHeaderLen:] }

// Frame writes the header of a chunk of n bytes into buf and returns the frame to send: the
// header and the first n bytes of Data(buf).
func Frame(buf []byte, n int) []byte {
	binary.BigEndian.PutUint32(buf, uint32(n))
	return buf[:ChunkHeaderLen+n]
}

// EndChunk is the empty chunk that ends a file.
var EndChunk = []byte{0, 0, 0, 0}

// ReadChunk reads the next chunk into buf (which must hold the largest chunk the peer sends:
// MaxChunk, or the file's size when smaller) and returns its data; the empty chunk returns
// (nil, io.EOF).
func ReadChunk(r io.Reader, buf []byte) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, noEOF(err)
	}
	n := binary.BigEndian.Uint32(h[:])
	switch {
	case n == 0:
		return nil, io.EOF
	case n > MaxChunk:
		return nil, fmt.Errorf("%w: chunk of %d bytes, the limit is %d", ErrFrame, n, MaxChunk)
	case int(n) > len(buf):
		return nil, fmt.Errorf("bulk: chunk of %d bytes for a buffer of %d", n, len(buf))
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return nil, noEOF(err)
	}
	return buf[:n], nil
}

// noEOF turns the end of the connection inside a frame into io.ErrUnexpectedEOF: only an
// empty chunk ends a file.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Err returns the error st reports, as a gRPC status error (nil for OK), so that a client sees
// the same error from a bulk transfer as from the gRPC calls.
func Err(st *sandboxv1.BulkStatus) error {
	if codes.Code(st.GetCode()) == codes.OK {
		return nil
	}
	return status.Error(codes.Code(st.GetCode()), st.GetMessage())
}
