package manager

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/egress"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// ServerOptions are the options of a gRPC server that serves Service: calls run on worker
// goroutines that are kept (grpc.NumStreamWorkers, one per CPU), whose stacks have grown
// already, rather than on a goroutine per call that grows its 8 KiB stack through Allocate's
// deep path (gRPC, sFuse's own call into the sandbox) by copying it (fusebox-bench manager;
// figures in docs/performance.md).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))}
}

// Service serves the Manager gRPC API on a Manager. Allocate and List need the caller's
// identity in the context (auth.Authenticator's interceptors put it there; a call without one
// is refused): the caller is recorded as the owner of what it allocates, ServiceAccount callers
// are held to Policy, and List shows a caller its own sandboxes only, unless it is an operator.
// Renew and Release need the lease token, whoever calls.
type Service struct {
	managerv1.UnimplementedManagerServer
	M *Manager
	// Policy authorises ServiceAccount callers' allocations; nil allows them nothing. Local
	// callers (the unix socket) are not held to it.
	Policy *auth.Policy
	// Templates changes the templates served, for AddTemplates and RemoveTemplate; nil:
	// they are fixed (FAILED_PRECONDITION).
	Templates TemplateEditor
}

// caller returns the identity the interceptors put in ctx.
func caller(ctx context.Context) (auth.Identity, error) {
	id, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Identity{}, fmt.Errorf("%w: the call carries no caller identity", auth.ErrUnauthenticated)
	}
	return id, nil
}

// toStatus is the one place where manager errors become gRPC status codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUnknownTemplate):
		code = codes.InvalidArgument
	case errors.Is(err, ErrUnitNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrBadLeaseToken):
		code = codes.PermissionDenied
	case errors.Is(err, ErrLeaseEnded), errors.Is(err, ErrUnsupported):
		// ErrUnsupported: retrying cannot help until the operator runs an allocator that
		// has the feature (UNIMPLEMENTED would read as a method this server lacks).
		code = codes.FailedPrecondition
	case errors.Is(err, ErrNoCapacity):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrAllocator):
		code = codes.Unavailable
	case errors.Is(err, auth.ErrDenied):
		code = codes.PermissionDenied
	case errors.Is(err, auth.ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, auth.ErrUnavailable):
		code = codes.Unavailable
	}
	return status.Error(code, err.Error())
}

// leaseTTL converts a request's lease TTL, for Allocate and Renew alike: absent is zero, and
// a malformed one (out of range, or seconds and nanos of opposite signs) is invalid rather
// than saturated into a valid-looking value.
func leaseTTL(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fmt.Errorf("%w: lease TTL: %v", ErrInvalid, err)
	}
	return d.AsDuration(), nil
}

func (s *Service) Allocate(ctx context.Context, req *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	resp, err := s.allocate(ctx, req)
	return resp, toStatus(err)
}

// AllocateStream is Allocate whose answer is the stream's one event, kept for the clients
// that call it (see the proto): no unit is named before sFuse any more.
func (s *Service) AllocateStream(req *managerv1.AllocateRequest, stream managerv1.Manager_AllocateStreamServer) error {
	resp, err := s.allocate(stream.Context(), req)
	if err != nil {
		return toStatus(err)
	}
	return stream.Send(&managerv1.AllocateEvent{Event: &managerv1.AllocateEvent_Allocated{Allocated: resp}})
}

// allocate serves Allocate and AllocateStream.
func (s *Service) allocate(ctx context.Context, req *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	ttl, err := leaseTTL(req.GetLeaseTtl())
	if err != nil {
		return nil, err
	}
	a, err := s.M.Allocate(ctx, AllocateRequest{AgentPublicKey: req.GetAgentPublicKey(), Template: req.GetTemplate(),
		Egress: req.GetEgress(), LeaseTTL: ttl, Labels: req.GetLabels(), Env: req.GetEnv(), Cwd: req.GetCwd(),
		Owner: id.Owner, Authorize: func(template string, allow egress.Allowlist) error { return s.Policy.Authorize(id, template, allow) }})
	if err != nil {
		return nil, err
	}
	return &managerv1.AllocateResponse{SandboxId: a.ID, Endpoint: a.Endpoint, SandboxPublicKey: a.SandboxKey,
		LeaseExpires: timestamppb.New(a.LeaseExpires), LeaseToken: a.LeaseToken,
		SandboxCertificate: a.SandboxCertificate}, nil
}

func (s *Service) Renew(ctx context.Context, req *managerv1.RenewRequest) (*managerv1.RenewResponse, error) {
	ttl, err := leaseTTL(req.GetLeaseTtl())
	if err != nil {
		return nil, toStatus(err)
	}
	exp, err := s.M.Renew(ctx, req.GetSandboxId(), req.GetLeaseToken(), ttl)
	if err != nil {
		return nil, toStatus(err)
	}
	return &managerv1.RenewResponse{LeaseExpires: timestamppb.New(exp)}, nil
}

func (s *Service) Release(ctx context.Context, req *managerv1.ReleaseRequest) (*managerv1.ReleaseResponse, error) {
	if err := s.M.Release(ctx, req.GetSandboxId(), req.GetLeaseToken()); err != nil {
		return nil, toStatus(err)
	}
	return &managerv1.ReleaseResponse{}, nil
}

var protoStates = map[State]managerv1.UnitState{
	Creating: managerv1.UnitState_UNIT_STATE_CREATING, Ready: managerv1.UnitState_UNIT_STATE_READY,
	Initialising: managerv1.UnitState_UNIT_STATE_INITIALISING, Bound: managerv1.UnitState_UNIT_STATE_BOUND,
	Destroying: managerv1.UnitState_UNIT_STATE_DESTROYING, Gone: managerv1.UnitState_UNIT_STATE_GONE,
	Failed: managerv1.UnitState_UNIT_STATE_FAILED,
}

// List shows the caller the sandboxes it allocated; an operator sees every unit, the warm pool
// included.
func (s *Service) List(ctx context.Context, _ *managerv1.ListRequest) (*managerv1.ListResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	var out managerv1.ListResponse
	for _, u := range s.M.List() {
		if !id.Operator && !owns(id, u) {
			continue
		}
		sb := &managerv1.Sandbox{SandboxId: u.Info.ID, State: protoStates[u.State], Template: u.Info.Template,
			Endpoint: u.Info.DataAddr, Error: u.Err}
		if !u.Info.Created.IsZero() {
			sb.Created = timestamppb.New(u.Info.Created)
		}
		if u.Lease != nil {
			sb.LeaseExpires = timestamppb.New(u.Lease.Expires)
			sb.Egress, sb.Labels = u.Lease.Egress, u.Lease.Labels
		}
		out.Sandboxes = append(out.Sandboxes, sb)
	}
	return &out, nil
}

// owns reports whether unit u is bound to caller id.
func owns(id auth.Identity, u Unit) bool { return u.Lease != nil && u.Lease.Owner == id.Owner }

// PoolStatus answers an operator with the pool's status. Any other caller learns only the
// states of its own sandboxes and the allocator's name: the pool's size, demand and counters
// tell of other tenants' work.
func (s *Service) PoolStatus(ctx context.Context, _ *managerv1.PoolStatusRequest) (*managerv1.PoolStatusResponse, error) {
	id, err := caller(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	st := s.M.Status()
	if !id.Operator {
		units := map[string]int32{}
		for _, u := range s.M.List() {
			if owns(id, u) {
				units[u.State.String()]++
			}
		}
		return &managerv1.PoolStatusResponse{Units: units, Allocator: st.Allocator}, nil
	}
	units := map[string]int32{}
	for k, v := range st.Units {
		units[k] = int32(v)
	}
	resp := &managerv1.PoolStatusResponse{Units: units, Target: int32(st.Target), Estimator: st.Estimator,
		DemandPerSecond: st.DemandPerSecond, ProvisioningLatency: durationpb.New(st.ProvisioningLatency),
		Allocations: st.Allocations, Creations: st.Creations, Destructions: st.Destructions, Failures: st.Failures, ColdWaits: st.ColdWaits,
		Allocator: st.Allocator}
	for _, p := range st.Pools {
		tp := &managerv1.TemplatePool{Template: p.Template, Estimator: p.Estimator, Target: int32(p.Target), Image: p.Image, Hash: p.Hash,
			Units: map[string]int32{}, DemandPerSecond: p.DemandPerSecond,
			ProvisioningLatency: durationpb.New(p.ProvisioningLatency), LastError: p.LastError}
		for k, v := range p.Units {
			tp.Units[k] = int32(v)
		}
		if !p.LastErrorAt.IsZero() {
			tp.LastErrorAt = timestamppb.New(p.LastErrorAt)
		}
		resp.Pools = append(resp.Pools, tp)
	}
	return resp, nil
}
