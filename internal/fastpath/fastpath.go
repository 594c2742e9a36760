// Package fastpath is the switch of the allocation's latency accelerators, the root of the
// latency wing (internal/fastpath/...). None of them is part of the trust core (see
// sandbox-server/fuse), which imports nothing of the wing: each only moves work off an
// allocation's critical path and can be switched off, leaving the plain path. An accelerator
// stays only while its measured gain clears a tenth of the plain path's allocation time
// (docs/performance.md); the names of those removed are still accepted by Set and ignored.
// There is one:
//
//   - KeepAwake: the sandbox server's Go runtime monitor never deep-sleeps
//     (localsandbox.KeepAwakeGODEBUG; the manager's setting, with --keep-sandboxes-awake).
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
const FlagHelp = `latency accelerators (see internal/fastpath): "all", "none" (the plain path), or keep-awake`

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
