// Package daemon runs a manager as a service: it builds the allocator and estimator from
// configuration, adopts what a previous run left, and serves the Manager gRPC API with gRPC
// health and Prometheus metrics until its context ends.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/processalloc"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	"github.com/fusebox-dev/fusebox/manager/transport"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// Config is the manager's configuration.
type Config struct {
	Listen        string // unix:///path or tcp://host:port
	MetricsListen string // host:port for /metrics; empty disables
	Allocator     string // runsc or process
	Insecure      bool   // allows the process allocator
	StateDir      string
	Runsc         string
	SandboxBinary string
	Estimator     string
	PoolSize      int
	PoolMax       int
	LeaseTTL      time.Duration
	MaxLeaseTTL   time.Duration
	// PoolPing is how often the unit the next allocation takes is checked for liveness
	// (manager.Options.PingInterval); 0 turns it off. Not with the kube allocator, whose
	// pool is shared by the replicas.
	PoolPing time.Duration
	// KeepSandboxesAwake is runscalloc.Options.KeepAwake (runsc allocator only).
	KeepSandboxesAwake bool
	// Limits are the runsc allocator's sandbox limits (zero fields: runscalloc.DefaultLimits).
	Limits runscalloc.Limits
	// FastPath is runscalloc.Options.FastPath with the runsc allocator; with the kube
	// allocator, set, it switches the sandbox pods to the plain path (see withFastPath).
	// nil: every accelerator.
	FastPath *fastpath.Switches
	// Image is runscalloc.Options.Image: the sandbox image as the sandboxes' root (runsc
	// allocator only; empty: a root assembled from the host).
	Image string
	// Templates are the templates besides the default one (a templates file: package
	// templates), each with its own image and warm pool (runsc allocator only).
	Templates []templates.Spec
	// Kube configures --allocator kube.
	Kube KubeConfig
	// Auth secures the API: TLS and tokens on a TCP listener, the socket's group on a unix one.
	Auth AuthConfig
	// Ready, if set, is called once the manager serves, with the address it listens on.
	Ready func(addr string)
}

// KubeConfig configures the Kubernetes allocator: sandbox pods in SandboxNamespace, leader
// election through a Lease in ManagerNamespace.
type KubeConfig struct {
	Kubeconfig       string // empty: in-cluster configuration
	SandboxNamespace string
	ManagerNamespace string
	Identity         string // this replica (the pod's name)
	SandboxImage     string // repository@sha256:... holding fusebox-sandbox
	// SandboxTemplate is a file holding the sandbox pod template (YAML, as components/manager
	// renders it); empty: kubealloc.DefaultTemplate(SandboxImage).
	SandboxTemplate string
	AgentSelector   map[string]string
	ManagerSelector map[string]string
	// AgentNamespaces are the namespaces whose pods (with AgentSelector's labels) may reach a
	// bound sandbox's data port; AgentCIDRs may reach it from outside the cluster.
	AgentNamespaces []string
	AgentCIDRs      []string
	// NetworkPolicy is the cluster's policy flavour: cilium (default), gke or kubernetes.
	NetworkPolicy string
	// ClusterDNS is where the cluster's pods send DNS queries (sandboxnet.ClusterDNS:
	// kube-dns, the default, nodelocaldns, gke-clouddns or aks-localdns).
	ClusterDNS string
	// ImagePullSecrets are given to every sandbox pod.
	ImagePullSecrets []string
	LeaderElect      bool
	// SeparateClaim is manager.Options.SeparateClaim: claim each pod with its own write
	// before binding it, instead of with the lease's write.
	SeparateClaim bool
	// Deployment names the manager's own Deployment in ManagerNamespace: once it is being
	// deleted, the manager stops its pool, removes every sandbox pod and then its finalizer
	// (kubealloc.RemovalFinalizer), so that nothing that waits for the Deployment to be gone
	// sees a sandbox outlive it. Empty: not watched.
	Deployment string
	// QPS and Burst limit this replica's API requests (0: kubealloc.DefaultQPS, DefaultBurst).
	QPS   float32
	Burst int
	// NodeName places every sandbox pod on one node: only for control planes without a
	// scheduler (tests).
	NodeName string
}

// AuthConfig secures the manager API (see manager/auth and manager/transport). A unix
// listener is guarded by its file permissions and identifies callers by their user id; a TCP
// listener serves TLS only and authenticates callers by ServiceAccount tokens.
type AuthConfig struct {
	// ListenGroup, for a unix listener, is the group that may use the socket besides its
	// owner (mode 0660); empty: the owner only (0600).
	ListenGroup string
	// OperatorUIDs are local users who see every tenant's sandboxes (root and the manager's
	// own user always do).
	OperatorUIDs []uint32
	// TLSCertFile and TLSKeyFile serve the TCP listener's certificate (reloaded on change)...
	TLSCertFile, TLSKeyFile string
	// ...or TLSSecret, a Kubernetes TLS Secret in the manager namespace (watched), made by the
	// manager when absent if TLSSecretCreate, for TLSDNSNames.
	TLSSecret       string
	TLSSecretCreate bool
	TLSDNSNames     []string
	// CAConfigMap is where the Secret's CA is published for agents (manager namespace).
	CAConfigMap string
	// TokenAudience is the audience agents' tokens must carry. Required with TCP.
	TokenAudience string
	// TokenCacheTTL bounds how long an accepted token is trusted without a new TokenReview.
	TokenCacheTTL time.Duration
	// PolicyFile is the authorisation policy (auth.PolicyFile); empty: no ServiceAccount may
	// allocate.
	PolicyFile string
}

// Run serves until ctx ends. Bound sandboxes outlive it; ready ones are destroyed on exit.
// With the kube allocator and KubeConfig.Deployment, once that Deployment is being deleted it
// stops serving, removes every sandbox pod and the Deployment's finalizer, and then waits for
// ctx to end (the garbage collector stops it).
func Run(ctx context.Context, c Config, log *slog.Logger) error {
	err := run(ctx, c, log)
	if errors.Is(err, errRemoved) {
		// Restarting would only fail (the Deployment is gone): wait to be stopped.
		log.Info("the sandboxes are removed and the manager's Deployment released: waiting to be stopped")
		<-ctx.Done()
		return nil
	}
	return err
}

// errRemoved is run's result once the installation's sandboxes are removed.
var errRemoved = errors.New("the sandboxes are removed")

func run(ctx context.Context, c Config, log *slog.Logger) (err error) {
	unlock, err := lockStateDir(c.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	addr, err := endpoint.Parse(c.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	api, err := secureAPI(ctx, addr, c, reg, log)
	if err != nil {
		return err
	}
	saved := c.Allocator == "runsc" && c.Templates == nil
	if saved {
		if c.Templates, err = templatesAtStart(c, log); err != nil {
			return err
		}
	}
	alloc, err := newAllocator(ctx, c, log)
	if err != nil {
		if saved && len(c.Templates) > 0 {
			return fmt.Errorf("%w (the templates served before, kept in %s: start with --templates FILE to replace them, `templates: []` for none)",
				err, filepath.Join(c.StateDir, servedTemplatesFile))
		}
		return err
	}
	defer alloc.shutdown() // after the manager's Close, deferred below
	if alloc.removing != nil {
		select {
		case <-alloc.removing: // the installation is being removed: no pool
			return alloc.remove(ctx, log)
		default:
		}
	}
	pools, err := poolsOf(c)
	if err != nil {
		return err
	}
	m, err := newManager(c, alloc.Allocator, pools, alloc.isLeader, reg, log)
	if err != nil {
		return err
	}
	var editor manager.TemplateEditor // nil: the templates are fixed
	if ra, ok := alloc.Allocator.(*runscalloc.Allocator); ok {
		if err := saveTemplates(c.StateDir, c.Templates); err != nil {
			return err
		}
		editor = &templateEditor{specs: c.Templates, alloc: ra, m: m, base: c.Limits, stateDir: c.StateDir}
	}
	ln, err := listen(addr, api)
	if err != nil {
		return err
	}
	defer ln.Close()
	// Serving ends with ctx or, when the installation is being removed, with errRemoving: the
	// sandboxes are then removed once the manager has closed (deferred first, so run last).
	sctx, stopServing := context.WithCancelCause(ctx)
	defer stopServing(nil)
	if alloc.removing != nil {
		go func() {
			select {
			case <-alloc.removing:
				stopServing(errRemoving)
			case <-sctx.Done():
			}
		}()
		defer func() {
			if err == nil && errors.Is(context.Cause(sctx), errRemoving) {
				err = alloc.remove(ctx, log)
			}
		}()
	}
	if err := m.Start(sctx); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.Close(cctx); err != nil {
			log.Error("destroying the warm pool on exit", "err", err)
		}
	}()
	return serve(sctx, c, addr, ln, &manager.Service{M: m, Policy: api.policy, Templates: editor}, api, reg, log)
}

// errRemoving ends serving when the manager's Deployment is being deleted; errRemoved follows.
var errRemoving = errors.New("the manager's Deployment is being deleted")

// lockStateDir creates the state directory and takes its lock, which unlock drops. One
// manager per state directory: a second one would adopt (destroy) the first one's pool. The
// kernel drops the lock when the holder dies, even by SIGKILL, so a restart after a crash
// takes it over and adopts.
func lockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening state directory lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("state directory %s is in use by another manager (%v)", dir, err)
	}
	return func() { lock.Close() }, nil
}

// allocator is the allocator c names and what goes with it: isLeader is the kube allocator's
// leader election (nil: always); shutdown releases what the allocator holds, after the manager
// has closed; removing (kube with KubeConfig.Deployment) is closed once the installation is
// being removed, and remove then removes the sandboxes and lets the removal finish.
type allocator struct {
	manager.Allocator
	isLeader func() bool
	shutdown func()
	removing <-chan struct{}
	remove   func(ctx context.Context, log *slog.Logger) error
}

// newAllocator builds the allocator c names.
func newAllocator(ctx context.Context, c Config, log *slog.Logger) (allocator, error) {
	if len(c.Templates) > 0 && c.Allocator != "runsc" && c.Allocator != "kube" {
		return allocator{}, fmt.Errorf("templates need the runsc or kube allocator (not %s)", c.Allocator)
	}
	switch c.Allocator {
	case "kube":
		return startKube(ctx, c.Kube, c.Templates, log)
	case "runsc":
		tmpl, err := c.Limits.Template()
		if err != nil {
			return allocator{}, err
		}
		tmpls := map[string]runscalloc.Template{manager.DefaultTemplate: tmpl}
		for _, spec := range c.Templates {
			if tmpls[spec.Name], err = runscalloc.FromSpec(spec, c.Limits); err != nil {
				return allocator{}, err
			}
		}
		a, err := runscalloc.NewContext(ctx, runscalloc.Options{Runsc: c.Runsc, StateDir: c.StateDir,
			SandboxBinary: c.SandboxBinary, Image: c.Image, KeepAwake: c.KeepSandboxesAwake, FastPath: c.FastPath, Logger: log,
			GrantEndpoints: c.Auth.ListenGroup != "", Templates: tmpls})
		if err != nil {
			return allocator{}, err
		}
		return allocator{Allocator: a, shutdown: func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := a.Shutdown(sctx); err != nil {
				log.Warn("releasing runsc's state on exit", "err", err)
			}
		}}, nil
	case "process":
		a, err := processalloc.New(processalloc.Options{Insecure: c.Insecure, StateDir: c.StateDir,
			SandboxBinary: c.SandboxBinary, Logger: log})
		if err != nil {
			return allocator{}, err
		}
		return allocator{Allocator: a, shutdown: func() {}}, nil
	}
	return allocator{}, fmt.Errorf("unknown allocator %q (want runsc, kube or process)", c.Allocator)
}

// newManager builds the manager over alloc. What depends on the runtime (the refill delay,
// the units' warm-up) the manager reads from the allocator's Capabilities.
func newManager(c Config, alloc manager.Allocator, pools []manager.TemplatePool, isLeader func() bool, reg prometheus.Registerer, log *slog.Logger) (*manager.Manager, error) {
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Template
	}
	return manager.New(manager.Options{Allocator: alloc, Templates: names, Pools: pools, Clock: manager.RealClock{},
		Conns: &initconns.Conns{}, PingInterval: c.PoolPing, IsLeader: isLeader, DefaultLeaseTTL: c.LeaseTTL,
		MaxLeaseTTL: c.MaxLeaseTTL, SeparateClaim: c.Kube.SeparateClaim, Logger: log, Metrics: manager.NewMetrics(reg)})
}

// poolsOf returns the warm pools of c: the default template's, sized by the pool flags, then
// each template's, sized by its own pool settings.
func poolsOf(c Config) ([]manager.TemplatePool, error) {
	est, err := estimator.New(c.Estimator, c.PoolSize, max(c.PoolMax, c.PoolSize))
	if err != nil {
		return nil, err
	}
	img := c.Image
	if c.Allocator == "kube" {
		img = c.Kube.SandboxImage
	}
	pools := []manager.TemplatePool{{Template: manager.DefaultTemplate, Estimator: est, Image: img}}
	for _, spec := range c.Templates {
		name, lo, hi := spec.Pool.Sizes()
		est, err := estimator.New(name, lo, hi)
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", spec.Name, err)
		}
		pools = append(pools, manager.TemplatePool{Template: spec.Name, Estimator: est, Image: spec.Image, Hash: spec.Hash()})
	}
	return pools, nil
}

// listen opens the API's listener (a unix socket's directory first) and gives a unix
// socket the group api allows.
func listen(addr endpoint.Addr, api *api) (net.Listener, error) {
	if addr.Network == "unix" {
		if err := os.MkdirAll(filepath.Dir(addr.Address), 0o755); err != nil {
			return nil, err
		}
	}
	ln, err := endpoint.Listen(addr)
	if err != nil {
		return nil, err
	}
	if err := api.shareSocket(addr); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// serve serves the Manager API and gRPC health on ln (on TCP, plaintext callers are told to
// use TLS), and metrics if configured, until ctx ends or a server fails.
func serve(ctx context.Context, c Config, addr endpoint.Addr, ln net.Listener, svc *manager.Service, api *api, reg *prometheus.Registry, log *slog.Logger) error {
	m := svc.M
	srv := grpc.NewServer(append(manager.ServerOptions(), api.serverOptions()...)...)
	managerv1.RegisterManagerServer(srv, svc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus(managerv1.Manager_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	go reportReady(ctx, hs, m, c.PoolSize, log)
	errc := make(chan error, 3)
	if addr.Network == "tcp" {
		// TLS handshakes to srv; plaintext callers are told to use TLS (and probes get health).
		tlsLn, plainLn := transport.Split(ln)
		plain := transport.PlaintextServer(hs)
		defer plain.Stop()
		go func() { errc <- plain.Serve(plainLn) }()
		ln = tlsLn
	}
	go func() { errc <- srv.Serve(ln) }()
	metrics, err := serveMetrics(c.MetricsListen, reg, errc, log)
	if err != nil {
		srv.Stop()
		return err
	}
	st := m.Status()
	log.Info("manager serving", "listen", addr.String(), "allocator", st.Allocator, "estimator", st.Estimator,
		"pool_size", c.PoolSize, "auth", api.describe)
	if c.Ready != nil {
		served := addr
		if addr.Network == "tcp" {
			served.Address = ln.Addr().String() // the port a ":0" listener got
		}
		c.Ready(served.String())
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.Stop()
			return err
		}
	}
	hs.Shutdown()
	srv.GracefulStop()
	if metrics != nil {
		metrics.Close()
	}
	return nil
}

// reportReady makes the Manager service's health SERVING once the pool is warm. The process is live at once (the health
// service's overall status, which liveness probes ask for); the Manager service is ready
// once the warm pool has first held a ready unit, so that a rollout (and `fusebox up`, which
// waits for it) ends with allocations served warm. Later dips of the pool do not take the
// replica out of its Service: an empty pool still serves, cold.
func reportReady(ctx context.Context, hs *health.Server, m *manager.Manager, poolSize int, log *slog.Logger) {
	if err := awaitWarm(ctx, m, poolSize); err != nil {
		return
	}
	hs.SetServingStatus(managerv1.Manager_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	log.Info("warm pool ready: serving as ready", "pool_size", poolSize)
}

// serveMetrics serves reg's /metrics on listen (none when empty), sending Serve's end to
// errc.
func serveMetrics(listen string, reg *prometheus.Registry, errc chan<- error, log *slog.Logger) (*http.Server, error) {
	if listen == "" {
		return nil, nil
	}
	mln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	metrics := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { errc <- metrics.Serve(mln) }()
	log.Info("serving metrics", "addr", "http://"+mln.Addr().String()+"/metrics")
	return metrics, nil
}

// awaitWarm returns once m's pool has held a ready unit (at once when the pool is sized 0),
// or ctx's error. A unit allocated between two looks at the pool counts: an allocation
// served is a unit that was ready.
func awaitWarm(ctx context.Context, m *manager.Manager, poolSize int) error {
	for poolSize > 0 {
		if s := m.Status(); s.Units[manager.Ready.String()] > 0 || s.Allocations > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
