package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
)

// Arm is one setting of the latency accelerators (internal/fastpath) in an interleaved
// comparison (fusebox-bench allocate --fast-path-arms). Each arm has a manager and a pool of
// its own in the benchmark's process, made with the arm's accelerators (the runsc
// allocator's Options.FastPath, which sets each sandbox's keep-awake), as fusebox local up --fast-path does. The agent (the Go SDK) has
// no accelerator of its own.
type Arm struct {
	// Name is the arm as asked for ("all", "none", "no-keep-awake", "keep-awake"), with "#2",
	// "#3" ... after a repeat (an A/A comparison such as all,all shows the noise).
	Name string
	// FastPath is the accelerators the arm asks for.
	FastPath fastpath.Switches
}

// DefaultArms are --fast-path-arms' default: the accelerators on (the reference, first) and
// off.
var DefaultArms = []string{"all", "none"}

// ArmsHelp describes --fast-path-arms.
const ArmsHelp = `accelerator settings to compare, interleaved, each with a manager and pool of its own (the first is the reference: the other phases run on it and the differences are against it): "all", "none", "no-NAME" (all but NAME) or NAME+NAME... (those only), NAME one of keep-awake; a repeated arm (all,all) measures the noise`

// ParseArm reads one arm: "all", "none", "no-NAME" (every accelerator but NAME) or a
// '+'-separated list of accelerator names (those only).
func ParseArm(v string) (Arm, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Arm{}, fmt.Errorf("empty fast-path arm")
	}
	if name, ok := strings.CutPrefix(v, "no-"); ok {
		off, err := fastpath.Parse(name)
		if err != nil || strings.Contains(name, ",") || name == "all" || !off.Any() {
			return Arm{}, fmt.Errorf("fast-path arm %q: no- takes one accelerator name (keep-awake)", v)
		}
		return Arm{Name: v, FastPath: without(fastpath.All(), off)}, nil
	}
	if strings.Contains(v, ",") {
		return Arm{}, fmt.Errorf("fast-path arm %q: join an arm's accelerators with '+' (the arms are separated by commas)", v)
	}
	s, err := fastpath.Parse(strings.ReplaceAll(v, "+", ","))
	if err != nil {
		return Arm{}, fmt.Errorf("fast-path arm %q: %w", v, err)
	}
	return Arm{Name: v, FastPath: s}, nil
}

// ParseArms reads the arms of --fast-path-arms, in order, naming the second and later
// occurrences of an arm NAME#2, NAME#3 ...
func ParseArms(vs []string) ([]Arm, error) {
	if len(vs) == 0 {
		return nil, fmt.Errorf("no fast-path arm")
	}
	seen := map[string]int{}
	var arms []Arm
	for _, v := range vs {
		a, err := ParseArm(v)
		if err != nil {
			return nil, err
		}
		seen[a.Name]++
		if n := seen[a.Name]; n > 1 {
			a.Name += "#" + strconv.Itoa(n)
		}
		arms = append(arms, a)
	}
	return arms, nil
}

// effective is the accelerators in effect for an arm whose sandboxes may be kept awake
// (--keep-sandboxes-awake) or not: the runsc allocator's rule (keep-awake needs both).
func (a Arm) effective(keepAwake bool) fastpath.Switches {
	s := a.FastPath
	s.KeepAwake = s.KeepAwake && keepAwake
	return s
}

// without is a with b's accelerators switched off.
func without(a, b fastpath.Switches) fastpath.Switches {
	return fastpath.Switches{KeepAwake: a.KeepAwake && !b.KeepAwake}
}

// interleave is the order of an interleaved run's allocations, as arm indices: rounds
// rounds, each taking every one of arms once, in an order rng shuffles afresh each round. Each
// arm thus meets the machine's drift alike (a round is a few seconds), and none always comes
// right after another (whose allocation and replacement leave the machine in their wake).
func interleave(arms, rounds int, rng *rand.Rand) []int {
	order := make([]int, 0, arms*rounds)
	round := make([]int, arms)
	for range rounds {
		for i := range round {
			round[i] = i
		}
		rng.Shuffle(arms, func(i, j int) { round[i], round[j] = round[j], round[i] })
		order = append(order, round...)
	}
	return order
}

// runArms makes an interleaved run's allocations in order (arm indices, as interleave returns
// them for arms arms): settle(arm) before each, then measure(arm), which returns the
// allocation's time. It stops at the first error, returning the
// samples made before it.
func runArms(order []int, arms int, settle func(arm int) error, measure func(arm int) (time.Duration, error)) ([]armSample, error) {
	samples := make([]armSample, 0, len(order))
	for n, i := range order {
		if err := settle(i); err != nil {
			return samples, err
		}
		d, err := measure(i)
		if err != nil {
			return samples, err
		}
		samples = append(samples, armSample{arm: i, round: n / arms, ms: ms(d)})
	}
	return samples, nil
}
