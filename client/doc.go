// Package client is the Go SDK agents use to talk to fusebox sandboxes directly over the
// key-pinned mTLS data plane.
//
// An agent generates a Key (in memory, never written anywhere), hands its public half to the
// manager when it allocates a sandbox, and dials the sandbox with the sandbox's public key that
// the manager returned:
//
//	key, _ := client.NewKey()
//	// ... allocate with key.PublicKey(), get endpoint and sandboxKey back ...
//	sb, err := client.Dial(endpoint, sandboxKey, key)
//	res, err := sb.Exec(ctx, client.Command{Script: "go test ./..."})
//
// Allocate and Manager.Allocate do all of that: they ask the manager for a sandbox, dial it
// and release the lease when the Allocation is closed.
//
// File transfers are batched: WriteFiles and WriteTree bin-pack small files into batches of at
// most 3.5 MiB sent concurrently and stream larger files; ReadFiles asks the sandbox for a plan
// first and then executes it. A streamed file (WriteFileFrom, ReadFileTo) moves over a bulk
// connection of its own, with the same pinned handshake but no HTTP/2 around the bytes
// (internal/bulk), or over the gRPC streams with Options.NoBulk or a server without it. Concurrent commands that change the shell environment use a
// TaskGroup so that the logically last write wins whatever order they finish in.
package client
