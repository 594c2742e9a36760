// Package sfuse is the manager's side of the sFuse handshake: one InitializeTLS call on a
// sandbox's init listener, which pins the agent's key and returns the sandbox's.
package sfuse

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Initialize calls InitializeTLS on the sandbox's init listener at initAddr with the agent's
// public key (DER SubjectPublicKeyInfo) and returns the sandbox's public key. The init channel
// carries no secrets (public keys only) and is reachable only by the manager, so it is not
// encrypted. Nothing is kept: the caller hands the key to the agent.
func Initialize(ctx context.Context, initAddr string, agentKey []byte) ([]byte, error) {
	a, err := endpoint.Parse(initAddr)
	if err != nil {
		return nil, fmt.Errorf("init address: %w", err)
	}
	conn, err := grpc.NewClient(a.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dialing init listener %s: %w", a, err)
	}
	defer conn.Close()
	resp, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx, &sandboxv1.InitializeTLSRequest{AgentPublicKey: agentKey})
	if err != nil {
		return nil, fmt.Errorf("InitializeTLS on %s: %w", a, err)
	}
	if _, err := tlspin.ParsePublicKey(resp.GetSandboxPublicKey()); err != nil {
		return nil, fmt.Errorf("InitializeTLS on %s returned a bad key: %w", a, err)
	}
	return resp.GetSandboxPublicKey(), nil
}
