package server

import (
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/fusebox-dev/fusebox/internal/coalesce"
)

// coalescedCreds sends the records of each Write of a data connection's TLS in one write of
// the connection below (package internal/coalesce): gRPC hands TLS up to its write buffer at a
// time, a bulk transfer a chunk, so a 256 MiB download costs some 1,000 writes through the
// sentry instead of 16,000. It is the write-side twin of bufferedConn's read buffer, and like
// it sits below TLS, outside what the pinning decides.
type coalescedCreds struct {
	credentials.TransportCredentials
}

func (c coalescedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	b := coalesce.Under(raw)
	conn, info, err := c.TransportCredentials.ServerHandshake(b)
	if err != nil {
		return nil, nil, err
	}
	return coalesce.Over(conn, b), info, nil
}

func (c coalescedCreds) Clone() credentials.TransportCredentials {
	return coalescedCreds{c.TransportCredentials.Clone()}
}
