package fuse

import (
	"crypto/tls"
	"net"
	"slices"

	"google.golang.org/grpc/credentials"

	"github.com/fusebox-dev/fusebox/internal/coalesce"
)

// DataOptions say what the data listener's transport does beside the pinned TLS handshake.
// None of it decides who is served: that is the TLS configuration's alone.
type DataOptions struct {
	// Bulk, if set, serves connections that negotiate BulkProto (offered by ALPN after the
	// configuration's own protocols, so a client that offers both gets HTTP/2): after the
	// same pinned handshake, such a connection goes to Bulk instead of gRPC.
	BulkProto string
	Bulk      func(net.Conn)
	// Port, if set, serves connections that negotiate PortProto (offered after BulkProto) as
	// Bulk serves BulkProto's: each carries one forwarded TCP connection both ways, so its
	// writes leave as they are made (not pipelined), and it can CloseWrite.
	PortProto string
	Port      func(net.Conn)
	// Handshake, if set, is called as a connection's handshake begins (done false) and once
	// it has succeeded (done true): a hook of the latency accelerators' allocation timeline.
	// Nil on the plain path.
	Handshake func(done bool)
}

// DataCredentials are the data listener's transport credentials, the only ones it serves
// with: crypto/tls with cfg (tlspin.ServerConfigCert: TLS 1.3, a client certificate whose key
// is the pinned one) over two buffers that pass the bytes through unchanged and change only
// how many system calls carry them: reads gathered up to connReadBufferMax below TLS
// (bufferedConn), and the records of each TLS write sent in one write (internal/coalesce).
// gRPC hands TLS up to its write buffer at a time, so under gVisor a download costs a
// sixteenth of the writes it would.
func DataCredentials(cfg *tls.Config, o DataOptions) credentials.TransportCredentials {
	if o.Bulk != nil || o.Port != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = slices.Clip(cfg.NextProtos)
	}
	if o.Bulk != nil {
		cfg.NextProtos = append(cfg.NextProtos, o.BulkProto)
	}
	if o.Port != nil {
		cfg.NextProtos = append(cfg.NextProtos, o.PortProto)
	}
	return dataCreds{TransportCredentials: credentials.NewTLS(cfg), o: o}
}

type dataCreds struct {
	credentials.TransportCredentials
	o DataOptions
}

func (c dataCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.o.Handshake != nil {
		c.o.Handshake(false)
	}
	b := coalesce.Under(newBufferedConn(raw))
	conn, info, err := c.TransportCredentials.ServerHandshake(b)
	if err != nil {
		return nil, nil, err
	}
	if c.o.Handshake != nil {
		c.o.Handshake(true)
	}
	if ti, ok := info.(credentials.TLSInfo); ok && c.o.Bulk != nil && ti.State.NegotiatedProtocol == c.o.BulkProto {
		// A bulk connection streams a file one way: its records are encrypted while the
		// previous ones are still being written to the host socket.
		go c.o.Bulk(coalesce.Pipelined(conn, b))
		return nil, nil, credentials.ErrConnDispatched
	}
	if ti, ok := info.(credentials.TLSInfo); ok && c.o.Port != nil && ti.State.NegotiatedProtocol == c.o.PortProto {
		go c.o.Port(coalesce.Over(conn, b))
		return nil, nil, credentials.ErrConnDispatched
	}
	return coalesce.Over(conn, b), info, nil
}

func (c dataCreds) Clone() credentials.TransportCredentials {
	return dataCreds{c.TransportCredentials.Clone(), c.o}
}
