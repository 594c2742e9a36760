// Package server implements the sandbox server's two gRPC services: Init, served once on the
// init listener (sFuse), and Sandbox, the data plane served over key-pinned TLS 1.3 after
// initialisation.
//
// The life of a server:
//  1. Serve starts the Init service on the init listener. The data listener is bound already
//     (binding a host socket from gVisor is a round trip to the host, kept off the allocation
//     path) but shut: no byte is read or written on any connection to it. It holds the latest
//     one unread (the connection a local manager opens ahead and hands to the agent, see
//     internal/handoff) and closes the others unserved.
//  2. The first valid InitializeTLS pins the agent's key, opens the data listener (the held
//     connection first) and starts the data plane, and returns the sandbox's public key (made
//     when the server started). A malformed request is refused and changes nothing.
//  3. From then on every InitializeTLS is refused ("the fuse blows"). Once the agent's first
//     data-plane call has been answered (or 250 ms have passed), the init server is stopped
//     and its listener closed, so that this work does not compete with the agent's
//     handshake; no code path starts it again.
//  4. If no InitializeTLS succeeds within the idle TTL, Serve returns ErrIdleTimeout and the
//     process exits.
package server
