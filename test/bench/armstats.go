package bench

import "slices"

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
	// (fastpath.Switches.String; keep-awake only with --keep-sandboxes-awake). The agent has
	// none of its own.
	FastPath string  `json:"fast_path"`
	Runs     int     `json:"runs"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	P99Ms    float64 `json:"p99_ms"`
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

// armSample is one measured warm allocation of an interleaved run.
type armSample struct {
	arm, round int
	ms         float64
}

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
		r := ArmResult{Arm: a.Name, FastPath: effective[i]}
		times := armTimes(samples, i)
		r.Runs = len(times)
		if len(times) > 0 {
			r.P50Ms, r.P90Ms, r.P99Ms = pct(times, 50), pct(times, 90), pct(times, 99)
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
