// Package floor measures the physical floors of moving small files inside a sandbox: a plain
// loop of open, write, close (or open, read, compare, close) in the sandbox itself, with no
// RPC, no atomic rename and no validation. The data plane's WriteFiles and ReadFiles figures
// are judged against them; fusebox-bench dataplane runs them there as the fusebox-floor
// helper. The benchmark and the floor share the workload defined here: the same paths (Dirs
// directories) and the same random contents (Content), so that both verify the same bytes.
// ReceiveStream and SendStream are the streaming floor: raw bytes over a host unix socket,
// alone or written to (read from) a file; SendStreamTLS and ReceiveStreamTLS the same out of a
// file under the data plane's pinned TLS 1.3.
package floor

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// Dirs is how many directories the workload's files are spread over, as a source tree's would be.
const Dirs = 50

// Path is file i's path under root: Dirs directories, files dealt round them.
func Path(root string, i int) string {
	return fmt.Sprintf("%s/d%02d/f%05d.txt", root, i%Dirs, i)
}

// Content is file i's contents: size random bytes (ChaCha8 seeded by i), incompressible and
// distinct per file, the same in the benchmark and in the floor.
func Content(i, size int) []byte {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(i))
	b := make([]byte, size)
	rand.NewChaCha8(seed).Read(b)
	return b
}

// Contents returns Content(i, size) for i in [0, n).
func Contents(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = Content(i, size)
	}
	return out
}

// WriteFiles writes n files of size bytes under dir (Path, Content) and returns the time the
// writes took, directory creation included; the contents are made before the clock starts.
func WriteFiles(dir string, n, size int) (time.Duration, error) {
	data := Contents(n, size)
	start := time.Now()
	for d := range min(n, Dirs) {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("d%02d", d)), 0o755); err != nil {
			return 0, err
		}
	}
	for i := range n {
		if err := os.WriteFile(Path(dir, i), data[i], 0o644); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// ReadFiles reads back the n files of size bytes WriteFiles wrote under dir, compares every
// byte with what it wrote, and returns the time that took; the expected contents are made
// before the clock starts.
func ReadFiles(dir string, n, size int) (time.Duration, error) {
	want := Contents(n, size)
	start := time.Now()
	for i := range n {
		got, err := os.ReadFile(Path(dir, i))
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(got, want[i]) {
			return 0, fmt.Errorf("%s: contents differ from what was written", Path(dir, i))
		}
	}
	return time.Since(start), nil
}

// streamBuf is the floor's socket buffer: as large as the client's stream chunk.
const streamBuf = 2 << 20

// ReceiveStream connects to the unix socket at path and reads from it until EOF: the raw
// throughput of a host unix socket into the sandbox, with no TLS, HTTP/2 or framing. With
// file set it writes what arrives to that file (created), in the same loop: the floor of any
// transfer that lands in a file. It returns the bytes read and the time from the connection to
// EOF (and the file's close).
func ReceiveStream(path, file string) (int64, time.Duration, error) {
	var w io.Writer = io.Discard
	var f *os.File
	if file != "" {
		var err error
		if f, err = os.Create(file); err != nil {
			return 0, 0, err
		}
		defer f.Close()
		w = f
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	start := time.Now()
	n, err := io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{c}, make([]byte, streamBuf))
	if err == nil && f != nil {
		err = f.Close()
	}
	return n, time.Since(start), err
}

// SendStream connects to the unix socket at path and writes n bytes of random data to it
// (made before the clock starts), then closes: the raw throughput out of the sandbox. With
// file set it sends that file's bytes instead (n is then ignored), read in the same loop. It
// returns the bytes sent and the time until the host had them all.
func SendStream(path string, n int64, file string) (int64, time.Duration, error) {
	var f *os.File
	if file != "" {
		var err error
		if f, err = os.Open(file); err != nil {
			return 0, 0, err
		}
		defer f.Close()
	}
	buf := Content(0, streamBuf)
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	start := time.Now()
	var sent int64
	if f != nil {
		sent, err = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{f}, buf)
	} else {
		// The same buffer written over and over: no copy beside the socket's own.
		for sent < n && err == nil {
			var k int
			k, err = c.Write(buf[:min(n-sent, int64(len(buf)))])
			sent += int64(k)
		}
	}
	if err != nil {
		return 0, 0, err
	}
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		return 0, 0, err
	}
	// The host answers one byte once it has read everything: the time covers the delivery.
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, 0, fmt.Errorf("waiting for the receiver: %w", err)
	}
	return sent, time.Since(start), nil
}

// SendStreamTLS is SendStream of a file under the data plane's pinned TLS 1.3, with no
// fusebox framing: the floor of any download that is encrypted. The helper plays the sandbox
// (the TLS server, as fusebox-sandbox is on the data socket): it makes a key, sends its public
// key (a 2-byte big-endian length and the DER SubjectPublicKeyInfo) in the clear, where a
// sandbox's comes through sFuse's Init exchange, and then serves the handshake with
// tlspin.ServerConfigCert pinning agentKey, the host's key. TLS's records are gathered under
// it and leave in one write per read of the file (the plain buffered writer any sender would
// use; the data plane does the same with internal/coalesce). It returns the bytes sent and
// the time from the end of the handshake until the host had them all.
func SendStreamTLS(path, file string, agentKey []byte) (int64, time.Duration, error) {
	pinned, err := tlspin.ParsePublicKey(agentKey)
	if err != nil {
		return 0, 0, fmt.Errorf("the host's key: %w", err)
	}
	key, err := tlspin.GenerateKey()
	if err != nil {
		return 0, 0, err
	}
	cert, err := tlspin.Certificate(key)
	if err != nil {
		return 0, 0, err
	}
	pub, err := tlspin.MarshalPublicKey(key.Public())
	if err != nil {
		return 0, 0, err
	}
	cfg, err := tlspin.ServerConfigCert(cert, pinned)
	if err != nil {
		return 0, 0, err
	}
	f, err := os.Open(file)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	buf := make([]byte, streamBuf)
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(pub))), pub...)); err != nil {
		return 0, 0, err
	}
	// The records of one Write leave together: a buffer a little larger than a read of the
	// file with its records' overhead, flushed after each Write.
	// The handshake's flights go straight out: the peer answers each.
	b := &buffered{Conn: c, r: c, w: c}
	t := tls.Server(b, cfg)
	if err := t.Handshake(); err != nil {
		return 0, 0, fmt.Errorf("TLS handshake: %w", err)
	}
	w := bufio.NewWriterSize(c, streamBuf+streamBuf/256)
	b.w = w
	start := time.Now()
	var sent int64
	for {
		n, rerr := f.Read(buf)
		if n > 0 {
			if _, err := t.Write(buf[:n]); err != nil {
				return 0, 0, err
			}
			if err := w.Flush(); err != nil {
				return 0, 0, err
			}
			sent += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return 0, 0, rerr
		}
	}
	// Every Write was flushed: the close_notify goes straight out (TLS allows no write
	// after it, a flush included).
	b.w = c
	if err := t.CloseWrite(); err != nil {
		return 0, 0, err
	}
	// The host answers one byte once it has read and checked everything.
	if _, err := io.ReadFull(t, make([]byte, 1)); err != nil {
		return 0, 0, fmt.Errorf("waiting for the receiver: %w", err)
	}
	return sent, time.Since(start), nil
}

// ReceiveStreamTLS is the host's side of SendStreamTLS on an accepted connection c: it reads
// the helper's public key, makes the pinned TLS 1.3 handshake as the data plane's client does
// (tlspin.ClientConfig with key), reads through a buffer as large as the floor's until the
// helper's close_notify, writing what arrives to w, and answers one byte. It returns the bytes
// received.
func ReceiveStreamTLS(c net.Conn, key crypto.Signer, w io.Writer) (int64, error) {
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return 0, err
	}
	der := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, der); err != nil {
		return 0, err
	}
	pinned, err := tlspin.ParsePublicKey(der)
	if err != nil {
		return 0, fmt.Errorf("the helper's key: %w", err)
	}
	cfg, err := tlspin.ClientConfig(key, pinned)
	if err != nil {
		return 0, err
	}
	t := tls.Client(&buffered{Conn: c, r: bufio.NewReaderSize(c, streamBuf), w: c}, cfg)
	if err := t.Handshake(); err != nil {
		return 0, fmt.Errorf("TLS handshake: %w", err)
	}
	n, err := io.CopyBuffer(struct{ io.Writer }{w}, t, make([]byte, streamBuf))
	if err != nil {
		return n, err
	}
	_, err = t.Write([]byte{1})
	return n, err
}

// buffered is a connection read and written through buffers, under TLS.
type buffered struct {
	net.Conn
	r io.Reader
	w io.Writer
}

func (b *buffered) Read(p []byte) (int, error)  { return b.r.Read(p) }
func (b *buffered) Write(p []byte) (int, error) { return b.w.Write(p) }
