package tlsflight

import (
	"crypto/tls"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// TestDialOptionsConnectsAhead checks that the first connection is opened before the
// relayed handshake is delivered, and closed when the gRPC connection closes without using it.
func TestDialOptionsConnectsAhead(t *testing.T) {
	ln, _ := listen(t)
	accepted := accept(t, ln)
	first := make(chan *Client) // never fed: the handshake has not finished
	cfg := tlspin.ClientConfigPin(func() (tls.Certificate, error) { return tls.Certificate{}, nil }, &tlspin.Pin{})
	conn, err := grpc.NewClient("passthrough:///sandbox", DialOptions(first, NetDialer("unix", ln.Addr().String()), cfg)...)
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	var server interface {
		io.Reader
		SetReadDeadline(time.Time) error
	}
	select {
	case c := <-accepted:
		if c == nil {
			t.Fatal("accept failed")
		}
		defer c.Close()
		server = c
	case <-time.After(10 * time.Second):
		conn.Close()
		t.Fatal("no connection was opened before the handshake was delivered")
	}
	conn.Close()
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := server.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the unused connection after the gRPC connection closed: read %d bytes, %v; want EOF", n, err)
	}
}
