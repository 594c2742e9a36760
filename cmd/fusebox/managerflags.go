package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/cmd/internal/managerflags"
)

// managerFlags are how run and status reach the manager.
type managerFlags struct {
	addr string
	managerflags.TLS
}

// register adds --manager, --token-file, --ca-file and --tls-server-name to f.
func (m *managerFlags) register(f *pflag.FlagSet) {
	f.StringVar(&m.addr, "manager", envOr("FUSEBOX_MANAGER", defaultManager), "manager address (unix:///path, or tcp://host:port: TLS, with --ca-file and --token-file) ($FUSEBOX_MANAGER)")
	m.TLS.Register(f)
}

func (m *managerFlags) options() []client.ManagerOption { return m.TLS.Options() }

// hint is what to check when the manager cannot be reached: a local one is started by
// fusebox local up; a tcp:// one must be reachable and trusted.
func (m *managerFlags) hint() string {
	if strings.HasPrefix(m.addr, "unix://") {
		return "is `fusebox local up` running? --manager " + m.addr
	}
	return "is the manager at --manager " + m.addr + " reachable, with its CA in --ca-file?"
}
