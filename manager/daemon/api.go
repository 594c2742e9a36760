package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/transport"
)

// api is how the manager API's listener is secured.
type api struct {
	creds    credentials.TransportCredentials
	authn    *auth.Authenticator
	policy   *auth.Policy
	group    int // the unix socket's group, or -1
	describe string
}

// secureAPI checks c.Auth against the listener and builds its credentials: on a unix socket
// the callers' user ids; on TCP, TLS and ServiceAccount tokens (refusing to start without a
// certificate or an audience). Its metrics go to reg.
func secureAPI(ctx context.Context, addr endpoint.Addr, c Config, reg prometheus.Registerer, log *slog.Logger) (*api, error) {
	a := c.Auth
	if addr.Network == "unix" {
		if a.TLSCertFile != "" || a.TLSSecret != "" || a.TokenAudience != "" {
			return nil, errors.New("--listen is a unix socket, guarded by its file permissions: --tls-* and --token-audience are for tcp:// listeners")
		}
		out := &api{creds: auth.PeerCredentials(), authn: auth.NewAuthenticator(auth.AuthenticatorOptions{OperatorUIDs: a.OperatorUIDs}),
			group: -1, describe: "unix socket: file permissions, callers by user id"}
		if a.ListenGroup != "" {
			g, err := user.LookupGroup(a.ListenGroup)
			if err != nil {
				return nil, fmt.Errorf("--listen-group: %w", err)
			}
			out.group, _ = strconv.Atoi(g.Gid)
			out.describe += ", group " + a.ListenGroup
		}
		return out, nil
	}
	if a.ListenGroup != "" {
		return nil, errors.New("--listen-group is for a unix socket listener")
	}
	if a.TokenAudience == "" {
		return nil, fmt.Errorf("--listen %s serves TLS and authenticates agents by ServiceAccount tokens: give --token-audience (the audience of the agents' projected tokens)", addr)
	}
	files := a.TLSCertFile != "" || a.TLSKeyFile != ""
	switch {
	case files && a.TLSSecret != "":
		return nil, errors.New("give either --tls-cert-file and --tls-key-file or --tls-secret, not both")
	case !files && a.TLSSecret == "":
		return nil, fmt.Errorf("--listen %s serves TLS: give --tls-cert-file and --tls-key-file, or --tls-secret", addr)
	case files && (a.TLSCertFile == "" || a.TLSKeyFile == ""):
		return nil, errors.New("--tls-cert-file and --tls-key-file go together")
	}
	cs, err := kubeClient(c.Kube)
	if err != nil {
		return nil, fmt.Errorf("a TCP listener reviews agents' tokens with the Kubernetes API: %w", err)
	}
	var src transport.Source
	if files {
		if src, err = transport.NewFiles(a.TLSCertFile, a.TLSKeyFile, log); err != nil {
			return nil, err
		}
	} else {
		if c.Kube.ManagerNamespace == "" {
			return nil, errors.New("--tls-secret needs --manager-namespace (where the Secret is)")
		}
		if a.TLSSecretCreate && len(a.TLSDNSNames) == 0 {
			return nil, errors.New("--tls-secret-create needs --tls-dns-names (the names agents reach the manager by: its Service's)")
		}
		owner, err := deploymentOwner(ctx, cs, c.Kube)
		if err != nil {
			return nil, err
		}
		src, err = transport.EnsureSecret(ctx, transport.SecretOptions{Client: cs, Namespace: c.Kube.ManagerNamespace, Name: a.TLSSecret,
			Create: a.TLSSecretCreate, DNSNames: a.TLSDNSNames, CAConfigMap: a.CAConfigMap, Owner: owner, Logger: log})
		if err != nil {
			return nil, err
		}
	}
	var policy *auth.Policy
	if a.PolicyFile != "" {
		if policy, err = auth.LoadPolicy(a.PolicyFile); err != nil {
			return nil, err
		}
	} else {
		log.Warn("no authorisation policy (--auth-policy): every ServiceAccount is refused")
	}
	tokens, err := auth.NewTokens(auth.TokenOptions{Review: auth.KubeTokenReviewer(cs), Audience: a.TokenAudience, CacheTTL: a.TokenCacheTTL,
		Metrics: auth.NewTokenMetrics(reg)})
	if err != nil {
		return nil, err
	}
	return &api{creds: credentials.NewTLS(transport.ServerConfig(src)),
		authn:  auth.NewAuthenticator(auth.AuthenticatorOptions{Tokens: tokens, Operators: policy.Operators()}),
		policy: policy, group: -1, describe: "TLS, ServiceAccount tokens with audience " + a.TokenAudience}, nil
}

// deploymentOwner is the manager's own Deployment (k.Deployment) as the owner of what the
// manager creates for itself: nil without one, or when it is gone (the allocator then refuses
// to start: the installation is removed).
func deploymentOwner(ctx context.Context, cs kubernetes.Interface, k KubeConfig) (*metav1.OwnerReference, error) {
	if k.Deployment == "" {
		return nil, nil
	}
	d, err := cs.AppsV1().Deployments(k.ManagerNamespace).Get(ctx, k.Deployment, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the manager's Deployment %s/%s (--deployment): %w", k.ManagerNamespace, k.Deployment, err)
	}
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}, nil
}

// kubeClient is a client for k's kubeconfig, or the in-cluster configuration.
func kubeClient(k KubeConfig) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if k.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration (--kubeconfig, or in-cluster): %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

func (a *api) serverOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{grpc.Creds(a.creds)}, a.authn.ServerOptions()...)
}

// shareSocket gives the unix socket to its group (mode 0660), if one is configured.
func (a *api) shareSocket(addr endpoint.Addr) error {
	if addr.Network != "unix" || a.group < 0 {
		return nil
	}
	if err := os.Chown(addr.Address, -1, a.group); err != nil {
		return fmt.Errorf("giving socket %s to its group: %w", addr.Address, err)
	}
	if err := os.Chmod(addr.Address, 0o660); err != nil {
		return fmt.Errorf("sharing socket %s with its group: %w", addr.Address, err)
	}
	return nil
}
