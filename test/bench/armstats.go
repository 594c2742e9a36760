package bench

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath"
)

// FastPathResult is the interleaved comparison of accelerator settings (AllocateResult.FastPath;
// fusebox-bench allocate --fast-path-arms).
type FastPathResult struct {
	// Rounds is how many rounds ran: in each, every arm made one warm allocation, in an order
	// shuffled afresh (with Seed).
	Rounds int         `json:"rounds"`
	Seed   uint64      `json:"seed"`
	Arms   []ArmResult `json:"arms"`
	Note   string      `json:"note"`
}

// ArmResult is one arm's warm allocations.
type ArmResult struct {
	Arm string `json:"arm"`
	// FastPath is the accelerators in effect on the manager's and the sandboxes' side
	// (fastpath.Switches.String; keep-awake only with --keep-sandboxes-awake), Agent the
	// agent's side (on, off).
	FastPath string  `json:"fast_path"`
	Agent    string  `json:"agent"`
	Runs     int     `json:"runs"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	P99Ms    float64 `json:"p99_ms"`
	// Relayed is how many of the arm's allocations used the relay, as the client's trace
	// hooks reported them (AllocateTrace.RelayedHandshake). Early naming and keep-awake
	// happen out of the Go agent's sight: FastPath says whether they were on.
	Relayed int `json:"relayed"`
	// VsReference compares the arm with the first one (absent on the first).
	VsReference *ArmDiff `json:"vs_reference,omitempty"`
}

// ArmDiff is an arm's warm allocations against the reference arm's (positive: this arm is
// slower).
type ArmDiff struct {
	Reference string `json:"reference"`
	// P50Ms, P90Ms and P99Ms are this arm's percentiles less the reference's.
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	P99Ms float64 `json:"p99_ms"`
	// PairedP50Ms is the median, over the rounds, of this arm's allocation less the
	// reference's in the same round (rounds are seconds apart, so the machine's drift mostly
	// cancels out); SlowerRounds is in how many of Rounds this arm's was the slower.
	PairedP50Ms  float64 `json:"paired_p50_ms"`
	SlowerRounds int     `json:"slower_rounds"`
	Rounds       int     `json:"rounds"`
}

// Mismatch is an accelerator the agent sees (relay) whose use in an arm's
// allocations does not match the arm's setting: on, yet some allocations went without it (a
// fallback to the plain path: a handshake that could not be finished), or off, yet some used it (a switch that did not reach a side).
type Mismatch struct {
	Name string
	On   bool // in the arm's setting
	Used int  // how many of the arm's allocations used it
}

// Mismatches lists a's accelerators whose use does not match its setting.
func (a ArmResult) Mismatches() []Mismatch {
	s, err := fastpath.Parse(a.FastPath)
	if err != nil {
		return nil
	}
	var out []Mismatch
	check := func(name string, on bool, n int) {
		if on && n < a.Runs || !on && n > 0 {
			out = append(out, Mismatch{Name: name, On: on, Used: n})
		}
	}
	check("relay", s.Relay, a.Relayed)
	return out
}

// armSample is one measured warm allocation of an interleaved run.
type armSample struct {
	arm, round int
	ms         float64
	used       used
}

// used is which of the agent-visible accelerators an allocation used.
type used struct{ relayed bool }

// usage records, through the client's trace hooks, which accelerators one allocation used.
// The hooks may be called on the client's goroutines.
type usage struct{ relayed atomic.Bool }

// observe sets ao's trace hooks to record into u, each calling the hook ao had before, if any.
func (u *usage) observe(ao *client.AllocateOptions) {
	tr := &client.AllocateTrace{}
	if ao.Trace != nil {
		*tr = *ao.Trace
	}
	relayed := tr.RelayedHandshake
	tr.RelayedHandshake = func(at time.Time) {
		u.relayed.Store(true)
		if relayed != nil {
			relayed(at)
		}
	}
	ao.Trace = tr
}

// get returns what u recorded.
func (u *usage) get() used { return used{relayed: u.relayed.Load()} }

// armTimes returns arm's allocation times (ms), in order.
func armTimes(samples []armSample, arm int) []float64 {
	var out []float64
	for _, s := range samples {
		if s.arm == arm {
			out = append(out, s.ms)
		}
	}
	return out
}

// summarizeArms puts an interleaved run's samples together by arm; effective holds each arm's
// accelerators in effect. Every arm but the first is compared with the first. An arm without
// samples has zero figures.
func summarizeArms(arms []Arm, effective []string, samples []armSample) []ArmResult {
	out := make([]ArmResult, len(arms))
	for i, a := range arms {
		r := ArmResult{Arm: a.Name, FastPath: effective[i], Agent: agentString(a.Agent())}
		times := armTimes(samples, i)
		r.Runs = len(times)
		if len(times) > 0 {
			r.P50Ms, r.P90Ms, r.P99Ms = pct(times, 50), pct(times, 90), pct(times, 99)
		}
		for _, s := range samples {
			if s.arm != i {
				continue
			}
			if s.used.relayed {
				r.Relayed++
			}
		}
		out[i] = r
	}
	for i := 1; i < len(out); i++ {
		ref, r := out[0], out[i]
		if ref.Runs == 0 || r.Runs == 0 {
			continue
		}
		d := &ArmDiff{Reference: ref.Arm, P50Ms: round(r.P50Ms - ref.P50Ms), P90Ms: round(r.P90Ms - ref.P90Ms), P99Ms: round(r.P99Ms - ref.P99Ms)}
		paired := pairedDiffs(samples, i, 0)
		d.Rounds = len(paired)
		for _, p := range paired {
			if p > 0 {
				d.SlowerRounds++
			}
		}
		if len(paired) > 0 {
			d.PairedP50Ms = median(paired)
		}
		out[i].VsReference = d
	}
	return out
}

// pairedDiffs returns, for each round with an allocation of both arm and ref, arm's time less
// ref's (ms), in round order.
func pairedDiffs(samples []armSample, arm, ref int) []float64 {
	type pair struct {
		a, r       float64
		hasA, hasR bool
	}
	byRound := map[int]*pair{}
	var rounds []int
	for _, s := range samples {
		if s.arm != arm && s.arm != ref {
			continue
		}
		p, ok := byRound[s.round]
		if !ok {
			p = &pair{}
			byRound[s.round] = p
			rounds = append(rounds, s.round)
		}
		if s.arm == arm {
			p.a, p.hasA = s.ms, true
		} else {
			p.r, p.hasR = s.ms, true
		}
	}
	slices.Sort(rounds)
	var out []float64
	for _, n := range rounds {
		if p := byRound[n]; p.hasA && p.hasR {
			out = append(out, p.a-p.r)
		}
	}
	return out
}

// median is the median of xs (the mean of the middle two for an even count), rounded to the
// microsecond; xs must not be empty. Unlike pct's nearest rank it does not lean to either
// side, which matters for differences that straddle zero.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return round(s[n/2])
	}
	return round((s[n/2-1] + s[n/2]) / 2)
}
