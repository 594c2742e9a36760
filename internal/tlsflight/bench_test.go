package tlsflight

import (
	"context"
	"crypto/tls"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// BenchmarkRelayedHandshake measures the CPU each step of a relayed handshake costs: making
// the ClientHello (agent), answering it (sandbox, during sFuse) and finishing (agent).
func BenchmarkRelayedHandshake(b *testing.B) {
	agent, sandbox := newPeer(b), newPeer(b)
	scfg, err := tlspin.ServerConfigCert(sandbox.cert, agent.key.Public())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("start", func(b *testing.B) {
		for b.Loop() {
			cl, err := StartClient(ctx, tlspin.ClientConfigPin(func() (tls.Certificate, error) { return agent.cert, nil }, &tlspin.Pin{}))
			if err != nil {
				b.Fatal(err)
			}
			cl.Abort()
		}
	})
	cl, err := StartClient(ctx, tlspin.ClientConfigPin(func() (tls.Certificate, error) { return agent.cert, nil }, &tlspin.Pin{}))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Abort()
	b.Run("answer", func(b *testing.B) {
		for b.Loop() {
			_, p, err := Answer(ctx, scfg, cl.Hello())
			if err != nil {
				b.Fatal(err)
			}
			p.Abort()
		}
	})
}

func BenchmarkFinish(b *testing.B) {
	agent, sandbox := newPeer(b), newPeer(b)
	scfg, _ := tlspin.ServerConfigCert(sandbox.cert, agent.key.Public())
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		pin := &tlspin.Pin{}
		cl, _ := StartClient(ctx, tlspin.ClientConfigPin(func() (tls.Certificate, error) { return agent.cert, nil }, pin))
		flight, p, _ := Answer(ctx, scfg, cl.Hello())
		pin.Set(sandbox.key.Public())
		b.StartTimer()
		tc, err := cl.Finish(ctx, flight)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cl.Abort()
		tc.Close()
		p.Abort()
		b.StartTimer()
	}
}
