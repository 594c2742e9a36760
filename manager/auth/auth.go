// Package auth decides who calls the manager API and what they may do.
//
// Authentication depends on how a call arrived:
//   - over the local unix socket (served with PeerCredentials), the caller is the user id the
//     kernel reports for the connection (SO_PEERCRED). Who may connect at all is decided by
//     the socket file's permissions; root and the manager's own user are operators;
//   - over TLS, the caller presents a Kubernetes ServiceAccount token with the manager's
//     audience as a bearer token, checked through TokenReview (Tokens).
//
// The Authenticator's interceptors put the caller's Identity in every call's context (the gRPC
// health service alone is served without one, for probes). A Policy then says which
// ServiceAccounts or namespaces may allocate, with which templates and within which egress
// ceiling. Sandboxes are recorded with their owner (Identity.Owner) and List shows a caller its
// own only, unless it is an operator; Renew and Release still need the lease token.
//
// Errors wrap ErrUnauthenticated, ErrDenied or ErrUnavailable; Status turns them into gRPC
// status errors. No error and no log line carries a token.
package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Errors of authentication and authorisation.
var (
	// ErrUnauthenticated: the call carries no acceptable credentials.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrDenied: the caller is known but the policy does not allow the request.
	ErrDenied = errors.New("permission denied")
	// ErrUnavailable: the credentials could not be checked (the Kubernetes API failed).
	ErrUnavailable = errors.New("authentication unavailable")
)

// Status is the one place where this package's errors become gRPC status codes.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Unauthenticated
	switch {
	case errors.Is(err, ErrDenied):
		code = codes.PermissionDenied
	case errors.Is(err, ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// Identity is an authenticated caller.
type Identity struct {
	// Owner is how the caller is recorded with the sandboxes it allocates and matched in List:
	// "uid:1000" for a local caller, "system:serviceaccount:<namespace>:<name>" for a
	// ServiceAccount.
	Owner string
	// Namespace and ServiceAccount name a ServiceAccount caller (empty for a local one).
	Namespace, ServiceAccount string
	// Operator callers see every tenant's sandboxes in List.
	Operator bool
}

// Local reports whether the caller came through the local unix socket.
func (id Identity) Local() bool { return id.ServiceAccount == "" }

// String names the caller in messages: "service account ns/name" or "local user 1000".
func (id Identity) String() string {
	if id.Local() {
		return "local user " + strings.TrimPrefix(id.Owner, "uid:")
	}
	return "service account " + id.Namespace + "/" + id.ServiceAccount
}

// LocalIdentity is the identity of a local caller with user id uid.
func LocalIdentity(uid uint32, operator bool) Identity {
	return Identity{Owner: "uid:" + strconv.FormatUint(uint64(uid), 10), Operator: operator}
}

// ServiceAccountIdentity is the identity of ServiceAccount namespace/name.
func ServiceAccountIdentity(namespace, name string) Identity {
	return Identity{Owner: "system:serviceaccount:" + namespace + ":" + name, Namespace: namespace, ServiceAccount: name}
}

type ctxKey struct{}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity the interceptors put in ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// Authenticator authenticates each call by how it arrived (see the package comment).
type Authenticator struct {
	tokens       *Tokens
	operatorUIDs []uint32
	operators    []string // "namespace/name"
}

// AuthenticatorOptions configure an Authenticator.
type AuthenticatorOptions struct {
	// Tokens authenticates callers over TLS; nil refuses every call that is not local.
	Tokens *Tokens
	// OperatorUIDs are local users, besides root and the manager's own, who see every
	// tenant's sandboxes.
	OperatorUIDs []uint32
	// Operators are ServiceAccounts ("namespace/name") who see every tenant's sandboxes
	// (Policy.Operators).
	Operators []string
}

// NewAuthenticator returns an Authenticator.
func NewAuthenticator(o AuthenticatorOptions) *Authenticator {
	uids := append([]uint32{0, uint32(os.Geteuid())}, o.OperatorUIDs...)
	return &Authenticator{tokens: o.Tokens, operatorUIDs: uids, operators: slices.Clone(o.Operators)}
}

// healthPrefix is the gRPC health service, served without authentication so that probes
// (the kubelet's gRPC probe sends no token) work; it says only whether the manager serves.
const healthPrefix = "/grpc.health.v1.Health/"

// Authenticate returns the caller of the call whose server context is ctx.
func (a *Authenticator) Authenticate(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no peer information", ErrUnauthenticated)
	}
	switch info := p.AuthInfo.(type) {
	case PeerCred:
		return LocalIdentity(info.UID, slices.Contains(a.operatorUIDs, info.UID)), nil
	case credentials.TLSInfo:
		if a.tokens == nil {
			return Identity{}, fmt.Errorf("%w: this manager accepts no callers over TCP", ErrUnauthenticated)
		}
		id, err := a.tokens.Authenticate(ctx, bearer(ctx))
		if err != nil {
			return Identity{}, err
		}
		id.Operator = slices.Contains(a.operators, id.Namespace+"/"+id.ServiceAccount)
		return id, nil
	default:
		return Identity{}, fmt.Errorf("%w: the connection is neither the local socket nor TLS", ErrUnauthenticated)
	}
}

// bearer returns the call's "authorization: Bearer <token>" token, or "".
func bearer(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
	}
	return ""
}

func (a *Authenticator) authenticate(ctx context.Context, method string) (context.Context, error) {
	if strings.HasPrefix(method, healthPrefix) {
		return ctx, nil
	}
	id, err := a.Authenticate(ctx)
	if err != nil {
		return nil, Status(err)
	}
	return NewContext(ctx, id), nil
}

// UnaryInterceptor authenticates each unary call and puts the Identity in its context.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates each streaming call and puts the Identity in its context.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
	}
}

// identityStream is a ServerStream whose context carries the caller.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// ServerOptions are the interceptors as server options.
func (a *Authenticator) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor())}
}
