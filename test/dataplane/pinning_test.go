package dataplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// rawExecMarker issues an Exec creating /workspace/<marker> over conn and returns the error
// of the stream's first message.
func rawExecMarker(ctx context.Context, conn *grpc.ClientConn, marker string) error {
	stream, err := sandboxv1.NewSandboxClient(conn).Exec(ctx, &sandboxv1.ExecRequest{Script: "touch /workspace/" + marker})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// h2Frame encodes one HTTP/2 frame.
func h2Frame(typ, flags byte, stream uint32, payload []byte) []byte {
	f := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(f[5:], stream)
	return append(f, payload...)
}

// plaintextH2Exec is a complete cleartext HTTP/2 (prior knowledge) gRPC Exec request that
// creates /workspace/<marker>: what a client that skips TLS altogether would send.
func plaintextH2Exec(t testing.TB, marker string) []byte {
	t.Helper()
	var hdr []byte
	for _, kv := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", "/fusebox.sandbox.v1.Sandbox/Exec"},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		// HPACK literal header field without indexing, new name, no Huffman coding.
		hdr = append(hdr, 0, byte(len(kv[0])))
		hdr = append(hdr, kv[0]...)
		hdr = append(hdr, byte(len(kv[1])))
		hdr = append(hdr, kv[1]...)
	}
	msg, err := proto.Marshal(&sandboxv1.ExecRequest{Script: "touch /workspace/" + marker})
	if err != nil {
		t.Fatal(err)
	}
	grpcMsg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	grpcMsg = append(grpcMsg, msg...)
	req := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	req = append(req, h2Frame(0x4, 0, 0, nil)...)       // SETTINGS
	req = append(req, h2Frame(0x1, 0x4, 1, hdr)...)     // HEADERS, END_HEADERS
	req = append(req, h2Frame(0x0, 0x1, 1, grpcMsg)...) // DATA, END_STREAM
	return req
}

// sendRaw writes payload to the data socket and returns everything the server sends back
// before it closes the connection.
func sendRaw(t testing.TB, path string, payload []byte) []byte {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("connecting to the data socket: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) // only a bound on a hung server
	c.Write(payload)                                // the server may hang up before reading it all
	resp, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept a connection that sent %d non-TLS bytes open", len(payload))
	}
	return resp
}

// recordingSandbox is a plaintext Sandbox server that records the scripts it is asked to run.
type recordingSandbox struct {
	sandboxv1.UnimplementedSandboxServer
	scripts chan string
}

func (r *recordingSandbox) Exec(req *sandboxv1.ExecRequest, _ sandboxv1.Sandbox_ExecServer) error {
	r.scripts <- req.GetScript()
	return nil
}

// TestPlaintextH2ExecIsAValidCall is the control for the raw HTTP/2 attempt below: served by a
// plaintext gRPC server, the hand-encoded request does reach Exec.
func TestPlaintextH2ExecIsAValidCall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h2c.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rec := &recordingSandbox{scripts: make(chan string, 1)}
	sandboxv1.RegisterSandboxServer(srv, rec)
	go srv.Serve(ln)
	defer srv.Stop()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(plaintextH2Exec(t, "m")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-rec.scripts:
		if s != "touch /workspace/m" {
			t.Fatalf("Exec got script %q", s)
		}
	case <-testenv.Context(t, 30*time.Second).Done():
		t.Fatal("the hand-encoded HTTP/2 request never reached Exec")
	}
}

func TestDataPlaneRejectsUnpinnedClients(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	// The agent's signer is needed for hand-built TLS configurations, so bind by hand.
	signer, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	agentKey, err := client.KeyFromSigner(signer)
	if err != nil {
		t.Fatal(err)
	}
	fused, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: agentKey.PublicKey()})
	if err != nil {
		t.Fatalf("sFuse: %v", err)
	}
	sandboxKey := fused.SandboxKey
	good := dial(t, sb.DataAddr, sandboxKey, agentKey)
	dataPath := socketPath(sb.DataAddr)

	// Control: the marker mechanism works for the pinned agent.
	if err := execMarker(ctx, good, "control"); err != nil {
		t.Fatalf("pinned agent: %v", err)
	}
	if _, err := good.Stat(ctx, "control", false); err != nil {
		t.Fatalf("control marker: %v", err)
	}

	grpcConn := func(t *testing.T, creds credentials.TransportCredentials) *grpc.ClientConn {
		conn, err := grpc.NewClient(sb.DataAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	agentCert, err := tlspin.Certificate(signer)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		attempt func(t *testing.T, marker string) error
	}{
		{"other agent key", func(t *testing.T, marker string) error {
			return execMarker(ctx, dial(t, sb.DataAddr, sandboxKey, sandboxtest.NewKey(t)), marker)
		}},
		{"TLS 1.3 without a client certificate", func(t *testing.T, marker string) error {
			cfg := &tls.Config{
				MinVersion:            tls.VersionTLS13,
				InsecureSkipVerify:    true, // the pin below is the check
				VerifyPeerCertificate: tlspintest.PinServer(sandboxKey),
				NextProtos:            []string{"h2"},
			}
			return rawExecMarker(ctx, grpcConn(t, credentials.NewTLS(cfg)), marker)
		}},
		{"TLS 1.2 with the pinned agent's certificate", func(t *testing.T, marker string) error {
			cfg := &tls.Config{
				MaxVersion:            tls.VersionTLS12,
				Certificates:          []tls.Certificate{agentCert},
				InsecureSkipVerify:    true,
				VerifyPeerCertificate: tlspintest.PinServer(sandboxKey),
				NextProtos:            []string{"h2"},
			}
			return rawExecMarker(ctx, grpcConn(t, credentials.NewTLS(cfg)), marker)
		}},
		{"plaintext gRPC", func(t *testing.T, marker string) error {
			return rawExecMarker(ctx, grpcConn(t, insecure.NewCredentials()), marker)
		}},
		{"raw plaintext HTTP/2 Exec", func(t *testing.T, marker string) error {
			return rawRejected(sendRaw(t, dataPath, plaintextH2Exec(t, marker)))
		}},
		{"garbage bytes", func(t *testing.T, marker string) error {
			junk := make([]byte, 64<<10)
			rand.Read(junk)
			return rawRejected(sendRaw(t, dataPath, junk))
		}},
		{"TLS ClientHello then garbage", func(t *testing.T, marker string) error {
			// A real TLS 1.3 handshake without a certificate, then junk instead of HTTP/2.
			conn, err := net.Dial("unix", dataPath)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			tc := tls.Client(conn, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{"h2"}})
			if err := tc.Handshake(); err != nil {
				return err
			}
			tc.Write(plaintextH2Exec(t, marker))
			_, err = io.ReadAll(tc)
			return errors.Join(err, errors.New("server hung up")) // always an error: nothing was served
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			marker := "marker-" + sanitize(tc.name)
			if err := tc.attempt(t, marker); err == nil {
				t.Errorf("%s: the attempt succeeded", tc.name)
			} else {
				t.Logf("refused: %v", err)
			}
			wantNoMarker(t, ctx, good, marker)
		})
	}

	// Pinning the wrong sandbox key: the client refuses the real server before sending anything.
	t.Run("client pinning the wrong sandbox key", func(t *testing.T) {
		impostor, err := tlspin.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		wrongPub, err := tlspin.MarshalPublicKey(impostor.Public())
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, sb.DataAddr, wrongPub, agentKey)
		err = execMarker(ctx, c, "marker-wrong-sandbox-key")
		if err == nil {
			t.Fatal("a client pinning another sandbox key accepted the real server")
		}
		t.Logf("refused: %v", err)
		wantNoMarker(t, ctx, good, "marker-wrong-sandbox-key")
	})

	// All of that left the server serving the pinned agent.
	if out := sandboxtest.Sh(t, ctx, good, "echo still-serving"); out != "still-serving\n" {
		t.Fatalf("pinned agent after the attempts: %q", out)
	}
}

// rawRejected turns the server's answer to non-TLS bytes into the attempt's error: the server
// must answer with nothing, or with a TLS alert record (content type 21), never with HTTP/2.
func rawRejected(resp []byte) error {
	if len(resp) == 0 || resp[0] == 21 {
		return errors.New("server hung up without serving")
	}
	return nil // served something: reported as a failed rejection
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
