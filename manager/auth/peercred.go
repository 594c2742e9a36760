package auth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"google.golang.org/grpc/credentials"
)

// PeerCred is the AuthInfo of a connection on the local unix socket: the connecting process's
// credentials as the kernel reports them (SO_PEERCRED, taken when it connected).
type PeerCred struct {
	credentials.CommonAuthInfo
	UID, GID uint32
	PID      int32
}

// AuthType implements credentials.AuthInfo.
func (PeerCred) AuthType() string { return "peercred" }

// PeerCredentials returns server transport credentials for a unix socket listener: no
// encryption (the kernel carries the bytes), and the peer's credentials as each connection's
// AuthInfo. A connection that is not a unix socket is refused.
func PeerCredentials() credentials.TransportCredentials { return peerCreds{} }

type peerCreds struct{}

func (peerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("auth: PeerCredentials are for servers")
}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("auth: peer credentials need a unix socket, not %T", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("auth: reading peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, nil, fmt.Errorf("auth: reading peer credentials: %w", err)
	}
	if gerr != nil {
		return nil, nil, fmt.Errorf("auth: reading peer credentials: %w", gerr)
	}
	return c, PeerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

func (p peerCreds) Clone() credentials.TransportCredentials { return p }

func (peerCreds) OverrideServerName(string) error { return nil }
