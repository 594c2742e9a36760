package adversarial

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// trustAttacks attack the sFuse and the TLS pin of bound sandboxes: initialise them again,
// and talk to their data plane without the pinned agent key.
func trustAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "trust")
	ctx := g.ctx
	l := s.allocate(t, ctx)
	dataPath := strings.TrimPrefix(l.Endpoint, "unix://")
	intruder := sandboxtest.NewKey(t)

	// marked judges an attempt to run "touch /workspace/<marker>" in target: refused if the
	// attempt erred and the marker does not exist (asked through target's own agent).
	marked := func(target *lease, marker string, err error) verdict {
		_, serr := target.C.Stat(ctx, marker, false)
		switch {
		case status.Code(serr) != codes.NotFound:
			return escapedf("the marker exists in %s (Stat: %v); the attempt returned %v", target.ID, serr, err)
		case err == nil:
			return escapedf("the attempt returned no error")
		}
		return refusedf("%.300v", err)
	}
	execAs := func(t *testing.T, target *lease, sandboxKey []byte, key *client.Key, marker string) error {
		c, err := client.Dial(target.Endpoint, sandboxKey, key)
		if err != nil {
			return err
		}
		defer c.Close()
		return touch(ctx, c, marker)
	}
	// pinHolds checks that the pinned agent still runs commands and the intruder's key does not.
	pinHolds := func(t *testing.T, marker string) error {
		if err := touch(ctx, l.C, "pinned-"+marker); err != nil {
			return fmt.Errorf("the pinned agent can no longer run a command: %w", err)
		}
		if v := marked(l, marker, execAs(t, l, l.SandboxKey, intruder, marker)); v.outcome != refused {
			return fmt.Errorf("the intruder's key: %s", v.detail)
		}
		return nil
	}

	initPath := filepath.Join(s.m.StateDir, "sandboxes", l.ID, "sock", "init.sock")
	for _, tc := range []struct{ name, addr string }{
		{"a second InitializeTLS on the init socket", "unix://" + initPath},
		{"InitializeTLS on the data socket", l.Endpoint},
	} {
		g.attack(tc.name, "sfuse.Initialize with another agent's key at "+tc.addr+", then that key runs a command", func(t *testing.T) verdict {
			ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := sfuse.Initialize(ictx, tc.addr, sfuse.Request{AgentKey: intruder.PublicKey()})
			if err == nil {
				return escapedf("InitializeTLS answered")
			}
			if perr := pinHolds(t, sanitize(tc.name)); perr != nil {
				return escapedf("InitializeTLS failed (%v), but %v", err, perr)
			}
			return refusedf("%v; the pin is unchanged", err)
		})
	}
	g.attack("a data-plane connection with another key", "client.Dial pinning the sandbox with a fresh agent key, then Exec", func(t *testing.T) verdict {
		return marked(l, "marker-other-key", execAs(t, l, l.SandboxKey, intruder, "marker-other-key"))
	})
	g.attack("another tenant's key", "the bystander's agent key at this sandbox's data plane", func(t *testing.T) verdict {
		return marked(l, "marker-bystander-key", execAs(t, l, l.SandboxKey, s.bystander.Key, "marker-bystander-key"))
	})
	g.attack("this agent's key at another tenant's sandbox", "this agent's key, pinning the bystander's sandbox key, at the bystander's data plane", func(t *testing.T) verdict {
		return marked(s.bystander, "marker-cross-tenant", execAs(t, s.bystander, s.bystander.SandboxKey, l.Key, "marker-cross-tenant"))
	})
	g.attack("a bulk write with another key", "WriteFileFrom of 4 MiB (the bulk path) with a fresh agent key", func(t *testing.T) verdict {
		c, err := client.Dial(l.Endpoint, l.SandboxKey, intruder)
		if err != nil {
			return marked(l, "marker-bulk", err)
		}
		defer c.Close()
		_, err = c.WriteFileFrom(ctx, "marker-bulk", 0o644, bytes.NewReader(make([]byte, 4<<20)), 4<<20)
		return marked(l, "marker-bulk", err)
	})
	g.attack("an impostor sandbox key", "the agent pins another sandbox key (a server in the middle): the client refuses the real server", func(t *testing.T) verdict {
		impostor, err := tlspin.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := tlspin.MarshalPublicKey(impostor.Public())
		if err != nil {
			t.Fatal(err)
		}
		return marked(l, "marker-impostor", execAs(t, l, pub, l.Key, "marker-impostor"))
	})

	rawExec := func(creds credentials.TransportCredentials, marker string) error {
		conn, err := grpc.NewClient(l.Endpoint, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		stream, err := sandboxv1.NewSandboxClient(conn).Exec(cctx, &sandboxv1.ExecRequest{Script: "touch /workspace/" + marker})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	g.attack("TLS without a client certificate", "TLS 1.3 to the data socket, no certificate, then Exec", func(t *testing.T) verdict {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, VerifyPeerCertificate: tlspintest.PinServer(l.SandboxKey), NextProtos: []string{"h2"}}
		return marked(l, "marker-no-cert", rawExec(credentials.NewTLS(cfg), "marker-no-cert"))
	})
	g.attack("a self-signed certificate of another key", "TLS 1.3 with a certificate of a fresh key, then Exec", func(t *testing.T) verdict {
		signer, err := tlspin.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tlspin.Certificate(signer)
		if err != nil {
			t.Fatal(err)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true,
			VerifyPeerCertificate: tlspintest.PinServer(l.SandboxKey), NextProtos: []string{"h2"}}
		return marked(l, "marker-self-signed", rawExec(credentials.NewTLS(cfg), "marker-self-signed"))
	})
	g.attack("plaintext gRPC", "gRPC without TLS to the data socket, then Exec", func(t *testing.T) verdict {
		return marked(l, "marker-plaintext", rawExec(insecure.NewCredentials(), "marker-plaintext"))
	})
	g.attack("garbage bytes", "64 KiB of random bytes to the data socket", func(t *testing.T) verdict {
		junk := make([]byte, 64<<10)
		rand.Read(junk)
		resp, err := sendRaw(dataPath, junk)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp) > 0 && resp[0] != 21 { // anything but a TLS alert record
			return escapedf("the server answered %d bytes: %.40q", len(resp), resp)
		}
		return refusedf("the server answered %d bytes (nothing, or a TLS alert) and hung up", len(resp))
	})
	if err := pinHolds(t, "final"); err != nil {
		t.Errorf("after the trust attacks: %v", err)
	}
	if err := s.unharmed(ctx, l); err != nil {
		t.Errorf("after the trust attacks: %v", err)
	}
}

// touch runs "touch /workspace/<marker>" through c.
func touch(ctx context.Context, c *client.Sandbox, marker string) error {
	res, err := c.Exec(ctx, client.Command{Script: "touch /workspace/" + marker})
	if err == nil && res.ExitCode != 0 {
		return fmt.Errorf("the command ran but failed: exit %d, %q", res.ExitCode, res.Stderr)
	}
	return err
}

// sendRaw writes payload to the unix socket at path and returns what the server sends back
// before it hangs up (an error if it keeps the connection open).
func sendRaw(path string, payload []byte) ([]byte, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write(payload) // the server may hang up before reading it all
	resp, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return resp, fmt.Errorf("the server kept a connection that sent %d bytes of garbage open", len(payload))
	}
	return resp, nil
}

// sanitize turns s into a file name.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
