// Package fastpath is the one seam for the allocation's latency accelerators. None of them is
// part of the trust path (sandbox-server/fuse and internal/tlspin): each only moves work off
// an allocation's critical path, and each can be switched off, alone or all at once, leaving
// the plain path (the data plane is credentials.NewTLS with the pinning configuration, over
// the sandbox server's byte-preserving read and write buffering below TLS; after that
// handshake a connection that chose the bulk protocol instead of HTTP/2 goes to the bulk
// handler, which fusebox-sandbox -bulk=false switches off). There is one:
//
//   - KeepAwake: the sandbox server's Go runtime monitor never deep-sleeps
//     (localsandbox.KeepAwakeGODEBUG).
package fastpath

import (
	"fmt"
	"slices"
	"strings"
)

// Switches says which accelerators are on. The zero value is the plain path.
type Switches struct {
	KeepAwake bool
}

// All is every accelerator on, the default.
func All() Switches { return Switches{KeepAwake: true} }

// Any reports whether any accelerator is on.
func (s Switches) Any() bool { return s != Switches{} }

// names are the accelerators' names in Parse and String, in order.
var names = []string{"keep-awake"}

// retired are the names of accelerators that were removed. Set ignores them, so that a
// -fast-path or --fast-path value written for an earlier release (the sandbox pods of a kube
// manager of that release, a script) still starts the process; Parse refuses them.
var retired = []string{"pool-procs", "relay", "handoff", "early-naming"}

func (s *Switches) fields() []*bool { return []*bool{&s.KeepAwake} }

// FlagHelp describes the value Parse reads, for command-line flags.
const FlagHelp = `latency accelerators (see internal/fastpath): "all", "none" (the plain path), or a comma-separated list of keep-awake`

// Parse reads "all", "none", or a comma-separated list of accelerator names.
func Parse(v string) (Switches, error) {
	switch v {
	case "all":
		return All(), nil
	case "none", "":
		return Switches{}, nil
	}
	var s Switches
	f := s.fields()
	for _, name := range strings.Split(v, ",") {
		i := slices.Index(names, strings.TrimSpace(name))
		if i < 0 {
			return Switches{}, fmt.Errorf("unknown accelerator %q (want all, none, or some of %s)", name, strings.Join(names, ", "))
		}
		*f[i] = true
	}
	return s, nil
}

// String is the value Parse reads back.
func (s Switches) String() string {
	switch s {
	case All():
		return "all"
	case Switches{}:
		return "none"
	}
	var on []string
	for i, b := range s.fields() {
		if *b {
			on = append(on, names[i])
		}
	}
	return strings.Join(on, ",")
}

// Set makes *Switches a flag.Value. It is Parse, but for the retired names, which it ignores.
func (s *Switches) Set(v string) error {
	kept := slices.DeleteFunc(strings.Split(v, ","), func(name string) bool {
		return slices.Contains(retired, strings.TrimSpace(name))
	})
	if len(kept) == 0 {
		kept = []string{"none"}
	}
	p, err := Parse(strings.Join(kept, ","))
	if err != nil {
		return err
	}
	*s = p
	return nil
}
