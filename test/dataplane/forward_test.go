package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/portfwd"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// Programs the forwarding tests run in the sandbox: stdlib Python, started by an Exec that
// lasts until the test ends (the sandbox has no network beyond loopback).
const (
	// echoPy echoes each connection's bytes back, half-closing after the agent's half-close,
	// and appends a line per accepted connection to /workspace/accepts.
	echoPy = `
import socket, socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        with open('/workspace/accepts', 'a') as f:
            f.write('accept\n')
        s = self.request
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            s.sendall(b)
        s.shutdown(socket.SHUT_WR)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
`
	// wsEchoPy is a WebSocket echo server (RFC 6455): it answers the opening handshake and
	// echoes each text or binary message until a close frame, which it answers.
	wsEchoPy = `
import base64, hashlib, socket, socketserver, struct, sys
GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
def read_exact(f, n):
    b = f.read(n)
    if len(b) != n:
        raise EOFError
    return b
class H(socketserver.StreamRequestHandler):
    def handle(self):
        key = None
        while True:
            line = self.rfile.readline().decode()
            if line in ('\r\n', ''):
                break
            k, _, v = line.partition(':')
            if k.strip().lower() == 'sec-websocket-key':
                key = v.strip()
        acc = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.wfile.write(('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' % acc).encode())
        self.wfile.flush()
        while True:
            h = read_exact(self.rfile, 2)
            op, n = h[0] & 0x0f, h[1] & 0x7f
            if n == 126:
                n = struct.unpack('>H', read_exact(self.rfile, 2))[0]
            elif n == 127:
                n = struct.unpack('>Q', read_exact(self.rfile, 8))[0]
            mask = read_exact(self.rfile, 4) if h[1] & 0x80 else b'\0\0\0\0'
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(self.rfile, n)))
            if n < 126:
                hdr = struct.pack('>BB', 0x80 | op, n)
            elif n < 65536:
                hdr = struct.pack('>BBH', 0x80 | op, 126, n)
            else:
                hdr = struct.pack('>BBQ', 0x80 | op, 127, n)
            self.wfile.write(hdr + data)
            self.wfile.flush()
            if op == 8:
                return
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
`
)

// startProgram runs a long-lived program in the sandbox (an Exec in a goroutine, ended when
// the test ends) and waits until port accepts a forwarded connection.
func startProgram(t testing.TB, c *client.Sandbox, port int, cmd client.Command) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd.Timeout = time.Hour
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Exec(ctx, cmd)
	}()
	t.Cleanup(func() { cancel(); <-done })
	sandboxtest.Eventually(t, time.Minute, fmt.Sprintf("port %d in the sandbox accepts", port), func() (bool, string) {
		select {
		case <-done:
			t.Fatalf("the program for port %d ended: %s", port, out.String())
		default:
		}
		conn, err := c.DialPort(context.Background(), port)
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
}

// pythonProgram is the command that runs src with python3 and args.
func pythonProgram(src string, args ...string) client.Command {
	return client.Command{Argv: append([]string{"python3", "-c", src}, args...)}
}

// liveConns returns the TCP connections on the sandbox's loopback to or from ports 3000-3002
// that are still open on either side (any state but LISTEN and TIME_WAIT), as the sandbox's
// network stack lists them: what a forward left open would leave there.
func liveConns(t testing.TB, ctx context.Context, c *client.Sandbox) int {
	t.Helper()
	out := sandboxtest.Sh(t, ctx, c, `python3 - <<'EOF'
tcp = 0
for f in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
        lines = open(f).read().splitlines()[1:]
    except OSError:
        continue
    for l in lines:
        p = l.split()
        ports = {int(p[1].rsplit(':', 1)[1], 16), int(p[2].rsplit(':', 1)[1], 16)}
        if ports & {3000, 3001, 3002} and p[3] not in ('0A', '06'):
            tcp += 1
print(tcp)
EOF`)
	var n int
	if _, err := fmt.Sscan(out, &n); err != nil {
		t.Fatalf("counting connections in the sandbox: %q: %v", out, err)
	}
	return n
}

// TestForwardPort: HTTP, a WebSocket and 64 MiB of raw TCP reach programs on the sandbox's
// loopback through forwards, with the sandbox on --network=none; a second agent key, a closed
// port and bad ports are refused with errors that say why; and once the forwards are closed
// no connection of theirs is left open in the sandbox (the server's goroutines are checked in
// sandbox-server/server's tests, where they can be counted).
func TestForwardPort(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	c := b.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	page := make([]byte, 300<<10)
	rand.Read(page)
	if err := c.WriteFile(ctx, "www/page.bin", page, 0o644); err != nil {
		t.Fatal(err)
	}
	startProgram(t, c, 3000, client.Command{Argv: []string{"python3", "-m", "http.server", "3000", "--bind", "127.0.0.1", "--directory", "/workspace/www"}})
	startProgram(t, c, 3001, pythonProgram(wsEchoPy, "3001"))
	startProgram(t, c, 3002, pythonProgram(echoPy, "3002"))
	sandboxtest.Eventually(t, 30*time.Second, "no connection left from the readiness probes", func() (bool, string) {
		n := liveConns(t, ctx, c)
		return n == 0, fmt.Sprintf("%d open", n)
	})

	t.Run("http", func(t *testing.T) {
		ln, err := c.ForwardPort(ctx, 3000, "")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		for range 3 {
			resp, err := hc.Get("http://" + ln.Addr().String() + "/page.bin")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, page) {
				t.Fatalf("GET through the forward: status %d, %d bytes (want %d, the same), %v", resp.StatusCode, len(body), len(page), err)
			}
		}
		resp, err := hc.Get("http://" + ln.Addr().String() + "/missing")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET /missing: %d, want 404", resp.StatusCode)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		ln, err := c.ForwardPort(ctx, 3001, "")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(time.Minute)) // a hang guard
		br := wsHandshake(t, conn, ln.Addr().String())
		big := make([]byte, 200<<10)
		rand.Read(big)
		for _, m := range []struct {
			op   byte
			data []byte
		}{{0x1, []byte("hello through the forward")}, {0x2, big}, {0x1, bytes.Repeat([]byte("x"), 300)}} {
			if _, err := conn.Write(wsFrame(m.op, m.data)); err != nil {
				t.Fatal(err)
			}
			op, data := wsRead(t, br)
			if op != m.op || !bytes.Equal(data, m.data) {
				t.Fatalf("echo: opcode %d, %d bytes; want opcode %d and the %d bytes sent", op, len(data), m.op, len(m.data))
			}
		}
		conn.Write(wsFrame(0x8, []byte{0x03, 0xe8}))
		if op, _ := wsRead(t, br); op != 0x8 {
			t.Fatalf("close answered with opcode %d", op)
		}
	})

	t.Run("raw 64 MiB", func(t *testing.T) {
		ln, err := c.ForwardPort(ctx, 3002, "")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		sent, got := sha256.New(), sha256.New()
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			for range 64 {
				rand.Read(buf)
				sent.Write(buf)
				if _, werr = conn.Write(buf); werr != nil {
					return
				}
			}
			werr = conn.(*net.TCPConn).CloseWrite()
		})
		n, err := io.Copy(got, conn)
		wg.Wait()
		if werr != nil || err != nil {
			t.Fatalf("sending: %v; receiving: %v", werr, err)
		}
		if n != 64<<20 || !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
			t.Fatalf("echoed %d bytes, want the 64 MiB sent, byte for byte (same SHA-256: %v)", n, bytes.Equal(sent.Sum(nil), got.Sum(nil)))
		}
	})

	t.Run("dial port", func(t *testing.T) {
		conn, err := c.DialPort(ctx, 3002)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "ping")
		conn.(interface{ CloseWrite() error }).CloseWrite()
		if got, err := io.ReadAll(conn); err != nil || string(got) != "ping" {
			t.Fatalf("echo over DialPort: %q, %v", got, err)
		}
	})

	t.Run("second agent key", func(t *testing.T) {
		accepts := func() int { return strings.Count(sandboxtest.Sh(t, ctx, c, "cat /workspace/accepts"), "accept") }
		before := accepts()
		other, err := client.Dial(b.DataAddr, b.SandboxKey, sandboxtest.NewKey(t))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		conn, err := other.DialPort(ctx, 3002)
		if err == nil {
			conn.Close()
			t.Fatal("a second agent key opened a forward")
		}
		if codeOf(err) != codes.Unavailable {
			t.Errorf("second key: %v, want Unavailable (the refused handshake)", err)
		}
		ln, err := other.ForwardPort(ctx, 3002, "")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		lc.SetDeadline(time.Now().Add(time.Minute))
		lc.Write([]byte("ping"))
		if got, _ := io.ReadAll(lc); len(got) != 0 {
			t.Fatalf("a second key's forward answered %q", got)
		}
		lc.Close()
		if n := accepts(); n != before {
			t.Fatalf("the program accepted %d connections from a second key's forwards", n-before)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		_, err := c.DialPort(ctx, 3999)
		if codeOf(err) != codes.Unavailable || !strings.Contains(err.Error(), "nothing listens on port 3999 inside the sandbox") {
			t.Errorf("closed port: %v, want Unavailable saying nothing listens on port 3999 inside the sandbox", err)
		}
		for _, port := range []int{0, 65536} {
			if _, err := c.DialPort(ctx, port); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("port %d out of range 1-65535", port)) {
				t.Errorf("DialPort(%d): %v, want InvalidArgument naming the range", port, err)
			}
			if _, err := c.ForwardPort(ctx, port, ""); codeOf(err) != codes.InvalidArgument {
				t.Errorf("ForwardPort(%d): %v, want InvalidArgument", port, err)
			}
			// The sandbox refuses them too, for a client that sends them anyway.
			err := rawForward(t, b, portfwd.Request{Port: uint32(port)}.Append(nil))
			if st, ok := status.FromError(err); !ok || st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), fmt.Sprintf("port %d out of range 1-65535", port)) {
				t.Errorf("raw request for port %d: %v, want the sandbox's InvalidArgument", port, err)
			}
		}
	})

	// An open forward shows in the count (its loopback connection's two ends), so that the
	// count would show one left open.
	open, err := c.DialPort(ctx, 3002)
	if err != nil {
		t.Fatal(err)
	}
	if n := liveConns(t, ctx, c); n != 2 {
		t.Fatalf("with a forward open the sandbox lists %d open loopback connections, want its 2 ends", n)
	}
	open.Close()
	sandboxtest.Eventually(t, 30*time.Second, "every forwarded connection closed in the sandbox", func() (bool, string) {
		n := liveConns(t, ctx, c)
		return n == 0, fmt.Sprintf("%d loopback connections open", n)
	})
}

// rawForward sends req on a forwarding connection of b's agent and returns the sandbox's
// answer (nil, or its refusal).
func rawForward(t testing.TB, b *sandboxtest.Bound, req []byte) error {
	t.Helper()
	cert, err := tlspin.Certificate(b.Key.Signer())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := tlspin.ParsePublicKey(b.SandboxKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlspin.ClientConfigCert(cert, pub)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NextProtos = []string{portfwd.Proto}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(context.Background(), "unix", socketPath(b.DataAddr))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write(req); err != nil {
		return err
	}
	return portfwd.ReadAnswer(c)
}

// wsHandshake makes a WebSocket opening handshake on conn and checks the server's accept key.
func wsHandshake(t testing.TB, conn net.Conn, host string) *bufio.Reader {
	t.Helper()
	var k [16]byte
	rand.Read(k[:])
	key := base64.StdEncoding.EncodeToString(k[:])
	fmt.Fprintf(conn, "GET /echo HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", host, key)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("WebSocket handshake: %v", err)
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Fatalf("WebSocket handshake: %s, accept %q", resp.Status, resp.Header.Get("Sec-WebSocket-Accept"))
	}
	return br
}

// wsFrame is one final, masked client frame.
func wsFrame(op byte, data []byte) []byte {
	f := []byte{0x80 | op}
	switch n := len(data); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = binary.BigEndian.AppendUint16(append(f, 0x80|126), uint16(n))
	default:
		f = binary.BigEndian.AppendUint64(append(f, 0x80|127), uint64(n))
	}
	var mask [4]byte
	rand.Read(mask[:])
	f = append(f, mask[:]...)
	for i, b := range data {
		f = append(f, b^mask[i%4])
	}
	return f
}

// wsRead reads one unmasked server frame.
func wsRead(t testing.TB, r *bufio.Reader) (byte, []byte) {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		t.Fatalf("reading a WebSocket frame: %v", err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		io.ReadFull(r, l[:])
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		io.ReadFull(r, l[:])
		n = binary.BigEndian.Uint64(l[:])
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		t.Fatalf("reading a WebSocket frame of %d bytes: %v", n, err)
	}
	return h[0] & 0x0f, data
}
