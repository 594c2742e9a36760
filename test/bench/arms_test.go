package bench

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
)

func TestParseArms(t *testing.T) {
	all := fastpath.All()
	arms, err := ParseArms([]string{"all", "none", " no-keep-awake ", "keep-awake+keep-awake", "keep-awake", "all", "all"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Arm{
		{"all", all}, {"none", fastpath.Switches{}}, {"no-keep-awake", fastpath.Switches{}},
		{"keep-awake+keep-awake", all}, {"keep-awake", fastpath.Switches{KeepAwake: true}},
		{"all#2", all}, {"all#3", all},
	}
	if !slices.Equal(arms, want) {
		t.Errorf("ParseArms = %+v, want %+v", arms, want)
	}
	for _, bad := range [][]string{nil, {""}, {"bogus"}, {"no-bogus"}, {"no-all"}, {"no-none"}, {"no-"}, {"no-keep-awake+keep-awake"}, {"early-naming"}, {"no-early-naming"}, {"early-naming+keep-awake"}, {"pool-procs"}, {"no-pool-procs"}, {"relay"}, {"no-relay"}, {"handoff"}, {"no-handoff"}, {"relay+handoff"}, {"keep-awake,keep-awake"}, {"keep-awake+"}, {"all", "nonee"}} {
		if got, err := ParseArms(bad); err == nil {
			t.Errorf("ParseArms(%q) = %+v, want an error", bad, got)
		}
	}
}

// DefaultArms parse, the accelerators on first (the reference) and off after.
func TestDefaultArms(t *testing.T) {
	arms, err := ParseArms(DefaultArms)
	if err != nil {
		t.Fatal(err)
	}
	if len(arms) != 2 || arms[0].FastPath != fastpath.All() || arms[1].FastPath.Any() {
		t.Errorf("DefaultArms = %+v, want all then none", arms)
	}
}

// An arm's keep-awake is in effect only with --keep-sandboxes-awake.
func TestArmEffective(t *testing.T) {
	a, _ := ParseArm("all")
	if got := a.effective(false).String(); got != "none" {
		t.Errorf("all without --keep-sandboxes-awake: %q in effect, want none", got)
	}
	if got := a.effective(true); got != fastpath.All() {
		t.Errorf("all with --keep-sandboxes-awake: %v in effect, want all", got)
	}
}

func TestInterleave(t *testing.T) {
	const arms, rounds = 3, 300
	order := interleave(arms, rounds, rand.New(rand.NewPCG(7, 0)))
	if len(order) != arms*rounds {
		t.Fatalf("%d allocations, want %d", len(order), arms*rounds)
	}
	first := make([]int, arms)
	for r := range rounds {
		round := slices.Clone(order[r*arms : (r+1)*arms])
		first[round[0]]++
		slices.Sort(round)
		if !slices.Equal(round, []int{0, 1, 2}) {
			t.Fatalf("round %d is %v, want every arm once", r, order[r*arms:(r+1)*arms])
		}
	}
	// Shuffled: each arm leads about a third of the rounds (a fixed or rotating order would
	// still pass the check above).
	for i, n := range first {
		if n < rounds/5 || n > rounds/2 {
			t.Errorf("arm %d leads %d of %d rounds, want about a third", i, n, rounds)
		}
	}
	again := interleave(arms, rounds, rand.New(rand.NewPCG(7, 0)))
	if !slices.Equal(order, again) {
		t.Error("the same seed gave another order")
	}
	if other := interleave(arms, rounds, rand.New(rand.NewPCG(8, 0))); slices.Equal(order, other) {
		t.Error("another seed gave the same order")
	}
	if got := interleave(1, 4, rand.New(rand.NewPCG(1, 0))); !slices.Equal(got, []int{0, 0, 0, 0}) {
		t.Errorf("one arm: %v", got)
	}
	if got := interleave(2, 0, rand.New(rand.NewPCG(1, 0))); len(got) != 0 {
		t.Errorf("no rounds: %v", got)
	}
}

// runArms settles before each allocation for the arm that makes it, numbers the rounds, and
// stops at the first error with what was measured before it.
func TestRunArms(t *testing.T) {
	order := []int{1, 0, 0, 1, 1, 0}
	var calls []string
	settle := func(i int) error { calls = append(calls, "settle "+string(rune('0'+i))); return nil }
	n := 0
	measure := func(i int) (time.Duration, error) {
		calls = append(calls, "measure "+string(rune('0'+i)))
		n++
		return time.Duration(n) * time.Millisecond, nil
	}
	samples, err := runArms(order, 2, settle, measure)
	if err != nil {
		t.Fatal(err)
	}
	want := []armSample{
		{arm: 1, round: 0, ms: 1}, {arm: 0, round: 0, ms: 2},
		{arm: 0, round: 1, ms: 3}, {arm: 1, round: 1, ms: 4},
		{arm: 1, round: 2, ms: 5}, {arm: 0, round: 2, ms: 6},
	}
	if !slices.Equal(samples, want) {
		t.Errorf("samples %+v, want %+v", samples, want)
	}
	if got := strings.Join(calls[:4], ", "); got != "settle 1, measure 1, settle 0, measure 0" {
		t.Errorf("calls begin %s", got)
	}

	boom := errors.New("boom")
	n = 0
	samples, err = runArms(order, 2, settle, func(i int) (time.Duration, error) {
		if n++; n == 3 {
			return 0, boom
		}
		return time.Millisecond, nil
	})
	if !errors.Is(err, boom) || len(samples) != 2 {
		t.Errorf("a failed third allocation: %d samples, err %v; want 2 and boom", len(samples), err)
	}
	samples, err = runArms(order, 2, func(int) error { return boom }, measure)
	if !errors.Is(err, boom) || len(samples) != 0 {
		t.Errorf("a failed settle: %d samples, err %v; want none and boom", len(samples), err)
	}
}

func TestSummarizeArms(t *testing.T) {
	arms, err := ParseArms([]string{"all", "none", "no-keep-awake"})
	if err != nil {
		t.Fatal(err)
	}
	// Four rounds, the arms in shuffled orders; no-keep-awake never ran. Round 4 is cut
	// short after the reference.
	samples := []armSample{
		{arm: 1, round: 0, ms: 1.5}, {arm: 0, round: 0, ms: 1},
		{arm: 0, round: 1, ms: 3}, {arm: 1, round: 1, ms: 2.5},
		{arm: 1, round: 2, ms: 4}, {arm: 0, round: 2, ms: 2},
		{arm: 0, round: 3, ms: 4}, {arm: 1, round: 3, ms: 9},
		{arm: 0, round: 4, ms: 3.5},
	}
	got := summarizeArms(arms, []string{"all", "none", "none"}, samples)
	want := []ArmResult{
		// 1, 2, 3, 3.5, 4: nearest rank.
		{Arm: "all", FastPath: "all", Runs: 5, P50Ms: 3, P90Ms: 4, P99Ms: 4},
		// 1.5, 2.5, 4, 9; paired with the reference: +0.5, -0.5, +2, +5.
		{Arm: "none", FastPath: "none", Runs: 4, P50Ms: 2.5, P90Ms: 9, P99Ms: 9,
			VsReference: &ArmDiff{Reference: "all", P50Ms: -0.5, P90Ms: 5, P99Ms: 5, PairedP50Ms: 1.25, SlowerRounds: 3, Rounds: 4}},
		{Arm: "no-keep-awake", FastPath: "none"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d arms, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if (g.VsReference == nil) != (w.VsReference == nil) || g.VsReference != nil && *g.VsReference != *w.VsReference {
			t.Errorf("arm %s against the reference: %+v, want %+v", w.Arm, g.VsReference, w.VsReference)
		}
		g.VsReference, w.VsReference = nil, nil
		if g != w {
			t.Errorf("arm %d: %+v, want %+v", i, g, w)
		}
	}
}

func TestPairedDiffs(t *testing.T) {
	samples := []armSample{
		{arm: 2, round: 1, ms: 10}, {arm: 0, round: 1, ms: 4},
		{arm: 0, round: 0, ms: 1}, {arm: 1, round: 0, ms: 7}, {arm: 2, round: 0, ms: 3},
		{arm: 1, round: 2, ms: 5}, // no reference in round 2
	}
	if got := pairedDiffs(samples, 2, 0); !slices.Equal(got, []float64{2, 6}) {
		t.Errorf("arm 2 against 0: %v, want [2 6] (in round order)", got)
	}
	if got := pairedDiffs(samples, 1, 0); !slices.Equal(got, []float64{6}) {
		t.Errorf("arm 1 against 0: %v, want [6]", got)
	}
}

func TestMedianAndRound(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, -1}, 2}, {[]float64{-3, -1, -2}, -2}, {[]float64{0.0004, -0.0016}, -0.001}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	if got := round(-1.2346); got != -1.235 {
		t.Errorf("round(-1.2346) = %v, want -1.235", got)
	}
	if got := round(1.2345); got != 1.235 && got != 1.234 { // 1.2345 is not exact in binary
		t.Errorf("round(1.2345) = %v", got)
	}
}
