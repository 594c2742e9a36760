package tlspin

import (
	"crypto/tls"
	"net"
	"testing"
)

// BenchmarkHandshake measures one pinned TLS 1.3 handshake over a unix socket.
func BenchmarkHandshake(b *testing.B) {
	agent, _ := GenerateKey()
	sandbox, _ := GenerateKey()
	srv, _ := ServerConfig(sandbox, agent.Public())
	cli, _ := ClientConfig(agent, sandbox.Public())
	ln, err := net.Listen("unix", b.TempDir()+"/s")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				s := tls.Server(c, srv)
				s.Handshake()
				s.Write([]byte("x"))
				s.Close()
			}()
		}
	}()
	buf := make([]byte, 1)
	for b.Loop() {
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		tc := tls.Client(c, cli)
		if err := tc.Handshake(); err != nil {
			b.Fatal(err)
		}
		tc.Read(buf)
		tc.Close()
	}
}
