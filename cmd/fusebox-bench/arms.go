package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/fusebox-dev/fusebox/test/bench"
)

// printArms prints the interleaved fast-path arms (bench allocate --fast-path-arms): each
// arm's warm allocations, each against the first arm.
func printArms(f *bench.FastPathResult) {
	if f == nil || len(f.Arms) == 0 {
		return
	}
	fmt.Printf("\nfast-path arms, interleaved (%d rounds, each arm once per round in a shuffled order, seed %d):\n", f.Rounds, f.Seed)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	ref := f.Arms[0].Arm
	fmt.Fprintf(w, "ARM\tFAST PATH\tRUNS\tP50 MS\tP90 MS\tP99 MS\tVS %s: P50 / P90 / P99\tPAIRED P50\tSLOWER ROUNDS\t\n", strings.ToUpper(ref))
	for _, a := range f.Arms {
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t", a.Arm, a.FastPath, a.Runs, a.P50Ms, a.P90Ms, a.P99Ms)
		if d := a.VsReference; d != nil {
			fmt.Fprintf(w, "%+.2f / %+.2f / %+.2f ms\t%+.2f ms\t%d of %d\t\n", d.P50Ms, d.P90Ms, d.P99Ms, d.PairedP50Ms, d.SlowerRounds, d.Rounds)
		} else {
			fmt.Fprint(w, "(reference)\t\t\t\n")
		}
	}
	w.Flush()
	fmt.Println("PAIRED P50: the median over the rounds of the arm's allocation less the reference's in the same round; positive: slower than the reference")
}
