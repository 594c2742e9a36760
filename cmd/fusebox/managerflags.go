package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/client"
)

// managerFlags are how run and status reach the manager.
type managerFlags struct {
	addr, tokenFile, caFile, serverName string
}

// register adds --manager, --token-file, --ca-file and --tls-server-name to f.
func (m *managerFlags) register(f *pflag.FlagSet) {
	f.StringVar(&m.addr, "manager", envOr("FUSEBOX_MANAGER", defaultManager), "manager address (unix:///path, or tcp://host:port: TLS, with --ca-file and --token-file) ($FUSEBOX_MANAGER)")
	f.StringVar(&m.tokenFile, "token-file", envOr("FUSEBOX_TOKEN_FILE", ""), "file holding a ServiceAccount token with the manager's audience, read again when it changes; for tcp:// managers ($FUSEBOX_TOKEN_FILE)")
	f.StringVar(&m.caFile, "ca-file", envOr("FUSEBOX_CA_FILE", ""), "PEM CA that signed a tcp:// manager's certificate (ConfigMap fusebox-manager-ca, key ca.crt) ($FUSEBOX_CA_FILE)")
	f.StringVar(&m.serverName, "tls-server-name", envOr("FUSEBOX_TLS_SERVER_NAME", ""), "name to check in the manager's certificate (default: the address's host) ($FUSEBOX_TLS_SERVER_NAME)")
}

func (m *managerFlags) options() []client.ManagerOption {
	return []client.ManagerOption{client.WithTokenFile(m.tokenFile), client.WithCAFile(m.caFile), client.WithServerName(m.serverName)}
}

// hint is what to check when the manager cannot be reached: a local one is started by
// fusebox local up; a tcp:// one must be reachable and trusted.
func (m *managerFlags) hint() string {
	if strings.HasPrefix(m.addr, "unix://") {
		return "is `fusebox local up` running? --manager " + m.addr
	}
	return "is the manager at --manager " + m.addr + " reachable, with its CA in --ca-file?"
}
