package daemon

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/manager/auth"
)

// AuthFlags registers on f the flags that secure the manager API, filling a: the same for
// every daemon command.
func AuthFlags(f *pflag.FlagSet, a *AuthConfig) {
	f.StringVar(&a.ListenGroup, "listen-group", "", "unix --listen: the group that may use the socket too (mode 0660; default: its owner only, 0600)")
	f.Var((*uidList)(&a.OperatorUIDs), "operator-uids", "unix --listen: local user ids that see every caller's sandboxes in List (root and the manager's own user always do), comma-separated")
	f.StringVar(&a.TLSCertFile, "tls-cert-file", "", "tcp --listen: PEM certificate chain to serve (reloaded when it changes; a mounted Secret's tls.crt)")
	f.StringVar(&a.TLSKeyFile, "tls-key-file", "", "tcp --listen: PEM key of --tls-cert-file (tls.key)")
	f.StringVar(&a.TLSSecret, "tls-secret", "", "tcp --listen: serve the certificate of this TLS Secret in --manager-namespace (tls.crt, tls.key, ca.crt; cert-manager compatible), watched for rotation")
	f.BoolVar(&a.TLSSecretCreate, "tls-secret-create", false, "create --tls-secret when it does not exist: a self-signed CA and a certificate for --tls-dns-names")
	f.StringSliceVar(&a.TLSDNSNames, "tls-dns-names", nil, "names of the certificate --tls-secret-create makes (the manager Service's DNS names, and those agents outside the cluster use: DNS names or IP addresses), comma-separated; a Secret it made for other names is made again")
	f.StringVar(&a.CAConfigMap, "ca-configmap", "", "publish --tls-secret's ca.crt for agents in this ConfigMap of --manager-namespace")
	f.StringVar(&a.TokenAudience, "token-audience", "", "tcp --listen: the audience agents' ServiceAccount tokens must carry (checked by TokenReview)")
	f.DurationVar(&a.TokenCacheTTL, "token-cache-ttl", auth.DefaultCacheTTL, "how long an accepted token is trusted before it is reviewed again (never past its expiry)")
	f.StringVar(&a.PolicyFile, "auth-policy", "", "authorisation policy (YAML: rules of namespaces/serviceAccounts, templates, egress ceiling; operators); without it no ServiceAccount may allocate")
}

// uidList is a pflag.Value of comma-separated user ids.
type uidList []uint32

func (u *uidList) String() string {
	s := make([]string, len(*u))
	for i, v := range *u {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(s, ",")
}

func (u *uidList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
		if err != nil {
			return fmt.Errorf("%q is not a user id", s)
		}
		*u = append(*u, uint32(n))
	}
	return nil
}

func (*uidList) Type() string { return "uids" }
