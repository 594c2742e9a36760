// Package server implements the sandbox server's two gRPC services: Init, served once on the
// init listener (sFuse), and Sandbox, the data plane served over key-pinned TLS 1.3 after
// initialisation.
//
// The life of a server:
//  1. Serve starts the Init service on the init listener. The data listener does not exist
//     yet: before initialisation there is nothing to connect to.
//  2. The first valid InitializeTLS generates the sandbox's keypair, pins the agent's key,
//     binds the data listener and starts the data plane, and returns the sandbox's public key.
//     A malformed request is refused and changes nothing.
//  3. Once that response is written, the init server is stopped and its listener closed; no
//     code path starts it again ("the fuse blows").
//  4. If no InitializeTLS succeeds within the idle TTL, Serve returns ErrIdleTimeout and the
//     process exits.
package server
