package server

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// BenchmarkStream streams one 64 MiB file in (WriteFileFrom) and out (ReadFileTo) through
// the whole data plane (pinned TLS, then a bulk connection or HTTP/2, the workspace) of an
// in-process server on a unix socket: the ceiling of the stack itself, without gVisor in the
// way.
func BenchmarkStream(b *testing.B) {
	initAddr, dataAddr, _ := startInProcessWith(b, Options{IdleTTL: time.Minute})
	ctx := context.Background()
	key, _ := client.NewKey()
	pub, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{1}).Read(data)
	for _, path := range []struct {
		name string
		opts client.Options
	}{{"bulk", client.Options{}}, {"grpc", client.Options{NoBulk: true}}} {
		sb, err := client.Dial(dataAddr, pub.SandboxKey, key, path.opts)
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Close()
		b.Run(path.name+"/in", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := sb.WriteFileFrom(ctx, "big", 0o644, bytes.NewReader(data), int64(len(data))); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(path.name+"/out", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := sb.ReadFileTo(ctx, "big", io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
