package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/fusebox-dev/fusebox/test/bench"
)

// printArms prints the interleaved fast-path arms (bench allocate --fast-path-arms): each
// arm's warm allocations, which accelerators they used, and each against the first arm.
func printArms(f *bench.FastPathResult) {
	if f == nil || len(f.Arms) == 0 {
		return
	}
	fmt.Printf("\nfast-path arms, interleaved (%d rounds, each arm once per round in a shuffled order, seed %d):\n", f.Rounds, f.Seed)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	ref := f.Arms[0].Arm
	fmt.Fprintf(w, "ARM\tFAST PATH (AGENT)\tRUNS\tP50 MS\tP90 MS\tP99 MS\tRELAYED\tVS %s: P50 / P90 / P99\tPAIRED P50\tSLOWER ROUNDS\t\n", strings.ToUpper(ref))
	for _, a := range f.Arms {
		fmt.Fprintf(w, "%s\t%s (%s)\t%d\t%.2f\t%.2f\t%.2f\t%d\t", a.Arm, a.FastPath, a.Agent, a.Runs, a.P50Ms, a.P90Ms, a.P99Ms, a.Relayed)
		if d := a.VsReference; d != nil {
			fmt.Fprintf(w, "%+.2f / %+.2f / %+.2f ms\t%+.2f ms\t%d of %d\t\n", d.P50Ms, d.P90Ms, d.P99Ms, d.PairedP50Ms, d.SlowerRounds, d.Rounds)
		} else {
			fmt.Fprint(w, "(reference)\t\t\t\n")
		}
	}
	w.Flush()
	fmt.Println("RELAYED: allocations the client's trace hooks saw use the relay (early naming and keep-awake act in the manager and the sandbox, unseen by the Go agent); PAIRED P50: the median over the rounds of the arm's allocation less the reference's in the same round; positive: slower than the reference")
	for _, a := range f.Arms {
		for _, m := range a.Mismatches() {
			if m.On {
				fmt.Printf("note: arm %s has %s on, but only %d of its %d allocations used it\n", a.Arm, m.Name, m.Used, a.Runs)
			} else {
				fmt.Printf("note: arm %s has %s off, yet %d of its %d allocations used it\n", a.Arm, m.Name, m.Used, a.Runs)
			}
		}
	}
}
