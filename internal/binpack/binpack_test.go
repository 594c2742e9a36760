package binpack

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// item is a named size; names tell equal sizes apart.
type item struct {
	name string
	size int64
}

func sizeOf(i item) int64 { return i.size }

// names lists the names of bins' items, bin by bin.
func names(bins [][]item) [][]string {
	out := make([][]string, len(bins))
	for i, b := range bins {
		for _, it := range b {
			out[i] = append(out[i], it.name)
		}
	}
	return out
}

func TestFirstFitDecreasing(t *testing.T) {
	a, b, c, d, e := item{"a", 6}, item{"b", 5}, item{"c", 4}, item{"d", 3}, item{"e", 2}
	tests := []struct {
		name     string
		items    []item
		bins     Bins
		want     [][]string
		wantOver []string
	}{
		{"nothing", nil, Bins{Capacity: 10}, nil, nil},
		{"one bin", []item{e, d, c}, Bins{Capacity: 10}, [][]string{{"c", "d", "e"}}, nil},
		// Decreasing: a(6) b(5) c(4) d(3) e(2); first fit: a+c, b+d+e.
		{"first fit in decreasing size", []item{e, d, c, b, a}, Bins{Capacity: 10}, [][]string{{"a", "c"}, {"b", "d", "e"}}, nil},
		{"equal sizes keep their order", []item{{"x", 4}, {"y", 4}, {"z", 4}}, Bins{Capacity: 8}, [][]string{{"x", "y"}, {"z"}}, nil},
		{"an item of exactly the capacity", []item{{"full", 10}, e}, Bins{Capacity: 10}, [][]string{{"full"}, {"e"}}, nil},
		{"over the capacity, in decreasing size", []item{{"big", 11}, e, {"bigger", 30}}, Bins{Capacity: 10},
			[][]string{{"e"}}, []string{"bigger", "big"}},
		// The first bin starts with 4 used: a(6) fills it, so c and d go to a second one.
		{"reserved room in the first bin", []item{a, c, d}, Bins{Capacity: 10, Reserved: 4}, [][]string{{"a"}, {"c", "d"}}, nil},
		{"over what the first bin leaves", []item{{"seven", 7}, d}, Bins{Capacity: 10, Reserved: 4}, [][]string{{"d"}}, []string{"seven"}},
		{"reserved over the capacity", []item{e}, Bins{Capacity: 10, Reserved: 11}, nil, []string{"e"}},
		// Sizes 6,6,6,2,2,2: three bins; with a look-back of 1 the twos only try the last bin.
		{"every bin tried", []item{{"p", 6}, {"q", 6}, {"r", 6}, {"s", 2}, {"t", 2}, {"u", 2}}, Bins{Capacity: 8},
			[][]string{{"p", "s"}, {"q", "t"}, {"r", "u"}}, nil},
		{"look back one bin", []item{{"p", 6}, {"q", 6}, {"r", 6}, {"s", 2}, {"t", 2}, {"u", 2}}, Bins{Capacity: 8, LookBack: 1},
			[][]string{{"p"}, {"q"}, {"r", "s"}, {"t", "u"}}, nil},
		{"zero sizes", []item{{"z1", 0}, {"z2", 0}}, Bins{Capacity: 1}, [][]string{{"z1", "z2"}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.items)
			bins, over := FirstFitDecreasing(tc.items, sizeOf, tc.bins)
			if got := names(bins); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("bins %v, want %v", got, tc.want)
			}
			if got := names([][]item{over})[0]; !slices.Equal(got, tc.wantOver) {
				t.Errorf("over %v, want %v", got, tc.wantOver)
			}
			if !slices.Equal(in, tc.items) {
				t.Errorf("items changed to %v", tc.items)
			}
		})
	}
}

// TestFirstFitDecreasingProperties packs random items and checks what first fit promises:
// every item exactly once; no bin over capacity (the first with its reserved room); an item
// left out exactly when it is over capacity less the reserved room; items in each bin in
// decreasing size; and, trying every bin, no item of a later bin would have fit in an earlier
// one even at the end.
func TestFirstFitDecreasingProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 500 {
		b := Bins{Capacity: 1 + rng.Int64N(1000), LookBack: []int{0, 0, 1, 3}[rng.IntN(4)]}
		if rng.IntN(2) == 0 {
			b.Reserved = rng.Int64N(b.Capacity + 1)
		}
		var items []item
		for i := range rng.IntN(200) {
			size := rng.Int64N(b.Capacity/2 + 1)
			if rng.IntN(10) == 0 {
				size = rng.Int64N(2 * b.Capacity)
			}
			items = append(items, item{fmt.Sprint(i), size})
		}
		bins, over := FirstFitDecreasing(items, sizeOf, b)

		seen := map[string]int{}
		used := make([]int64, len(bins))
		for i, bin := range bins {
			if len(bin) == 0 {
				t.Fatalf("trial %d: bin %d is empty", trial, i)
			}
			if i == 0 {
				used[i] = b.Reserved
			}
			for j, it := range bin {
				seen[it.name]++
				used[i] += it.size
				if it.size > b.Capacity-b.Reserved {
					t.Fatalf("trial %d: %v packed although over %d-%d", trial, it, b.Capacity, b.Reserved)
				}
				if j > 0 && it.size > bin[j-1].size {
					t.Fatalf("trial %d: bin %d not in decreasing size: %v", trial, i, bin)
				}
			}
			if used[i] > b.Capacity {
				t.Fatalf("trial %d: bin %d holds %d, over %d", trial, i, used[i], b.Capacity)
			}
		}
		for _, it := range over {
			seen[it.name]++
			if it.size <= b.Capacity-b.Reserved {
				t.Fatalf("trial %d: %v left out although it fits", trial, it)
			}
		}
		for _, it := range items {
			if seen[it.name] != 1 {
				t.Fatalf("trial %d: %v appears %d times", trial, it, seen[it.name])
			}
		}
		if b.LookBack == 0 {
			for j := range bins {
				for i := range j {
					for _, it := range bins[j] {
						if used[i]+it.size <= b.Capacity {
							t.Fatalf("trial %d: %v went into bin %d but fits bin %d (%d of %d used)", trial, it, j, i, used[i], b.Capacity)
						}
					}
				}
			}
		}
	}
}
