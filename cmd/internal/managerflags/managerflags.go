// Package managerflags holds the flags that secure a command's connection to a tcp://
// manager, shared by fusebox (run, status) and fusebox-bench (allocate --manager):
// --token-file, --ca-file and --tls-server-name, each defaulting to its environment variable.
package managerflags

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/client"
)

// TLS is what the flags hold.
type TLS struct {
	TokenFile, CAFile, ServerName string
}

// Register adds --token-file, --ca-file and --tls-server-name to f.
func (m *TLS) Register(f *pflag.FlagSet) {
	f.StringVar(&m.TokenFile, "token-file", os.Getenv("FUSEBOX_TOKEN_FILE"), "file holding a ServiceAccount token with the manager's audience, read again when it changes; for tcp:// managers ($FUSEBOX_TOKEN_FILE)")
	f.StringVar(&m.CAFile, "ca-file", os.Getenv("FUSEBOX_CA_FILE"), "PEM CA that signed a tcp:// manager's certificate (ConfigMap fusebox-manager-ca, key ca.crt) ($FUSEBOX_CA_FILE)")
	f.StringVar(&m.ServerName, "tls-server-name", os.Getenv("FUSEBOX_TLS_SERVER_NAME"), "name to check in the manager's certificate (default: the address's host) ($FUSEBOX_TLS_SERVER_NAME)")
}

// Options are the client's options for what the flags hold.
func (m *TLS) Options() []client.ManagerOption {
	return []client.ManagerOption{client.WithTokenFile(m.TokenFile), client.WithCAFile(m.CAFile), client.WithServerName(m.ServerName)}
}
