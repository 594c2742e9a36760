// Package server implements the sandbox server: the trust path of package fuse (the one-shot
// Init service and the data socket's gate) around the Sandbox data plane, served over
// key-pinned TLS 1.3 after initialisation.
//
// The life of a server:
//  1. Serve hands the init and data listeners to a fuse.Fuse. The data listener is bound
//     already (binding a host socket from gVisor is a round trip to the host, kept off the
//     allocation path) but serves nothing until the fuse blows.
//  2. The first valid InitializeTLS pins the agent's key; the server's start (fuse.Start)
//     starts egress when the allocation has an allowlist and builds the data plane on the
//     credentials the fuse gives it (fuse.DataCredentials); the fuse opens the gate, closes
//     the init listener before the response is written, and answers with the sandbox's public
//     key (made when the server started). A malformed request is refused and changes nothing.
//  3. From then on every InitializeTLS is refused and no code path reopens the init listener.
//  4. If no InitializeTLS succeeds within the idle TTL, Serve returns ErrIdleTimeout and the
//     process exits.
//
// The latency accelerators the server takes part in (Options.FastPath, internal/fastpath)
// can each be switched off; they change nothing of the data plane's transport, which is the
// fuse's fuse.DataCredentials either way (with them on, its handshake hook marks the
// allocation timeline).
//
// A data connection whose handshake negotiated bulk.Proto instead of HTTP/2 is handed out of
// gRPC after the handshake and carries bulk transfers of large files (bulk.go, package
// internal/bulk); Options.NoBulk does not offer it.
package server
