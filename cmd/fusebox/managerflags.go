package main

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/cmd/internal/managerflags"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
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

// dial connects to the manager's API; closeConn closes the connection, after the calls.
func (m *managerFlags) dial() (_ managerv1.ManagerClient, closeConn func() error, _ error) {
	conn, err := client.DialManager(m.addr, m.options()...)
	if err != nil {
		return nil, nil, err
	}
	return managerv1.NewManagerClient(conn), conn.Close, nil
}

// explain adds to err, a failed call to the manager, what to check when no manager answered
// it; an answer (a refusal, the manager's own failure) is left as it is.
func (m *managerFlags) explain(err error) error {
	if !nothingAnswered(err) {
		return err
	}
	return fmt.Errorf("%w (%s)", err, m.hint())
}

// hint is what to check when the manager cannot be reached: a local one is started by
// fusebox local up; a tcp:// one must be reachable and trusted.
func (m *managerFlags) hint() string {
	if strings.HasPrefix(m.addr, "unix://") {
		return "is `fusebox local up` running? --manager " + m.addr
	}
	return "is the manager at --manager " + m.addr + " reachable, with its CA in --ca-file?"
}
