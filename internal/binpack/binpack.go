// Package binpack packs items into bins of bounded size, first fit over the items in
// decreasing size, which keeps the number of bins near the minimum. Both ends of a file
// transfer use it: the client to batch WriteFiles requests, the sandbox server to plan
// ReadFiles batches. It has no dependencies beyond the standard library, so the sandbox
// server can link it.
package binpack

import (
	"cmp"
	"slices"
)

// Bins describes the bins items are packed into.
type Bins struct {
	// Capacity is the most a bin holds.
	Capacity int64
	// Reserved is room taken in the first bin before any item goes in (the fixed part of a
	// request that only the first one carries). An item larger than Capacity-Reserved is
	// left out of every bin, so that each packed item fits alone in any bin, the first one
	// included.
	Reserved int64
	// LookBack, when positive, makes first fit try only the LookBack bins opened last, so
	// that packing stays linear in the number of items; 0 tries every bin.
	LookBack int
}

// FirstFitDecreasing packs items into bins: it takes them in decreasing size (items of the
// same size keep their order) and puts each into the first bin with room left for it, or
// into a new bin. It returns the bins in the order they were opened, each with its items in
// the order they went in, and the items too large for any bin (over Capacity-Reserved) in
// decreasing size. Every item appears exactly once; items is not modified.
func FirstFitDecreasing[T any](items []T, size func(T) int64, b Bins) (bins [][]T, over []T) {
	type sized struct {
		item T
		size int64
	}
	order := make([]sized, len(items))
	for i, it := range items {
		order[i] = sized{it, size(it)}
	}
	slices.SortStableFunc(order, func(x, y sized) int { return cmp.Compare(y.size, x.size) })
	var used []int64 // of each bin
	for _, it := range order {
		if b.Reserved > b.Capacity || it.size > b.Capacity-b.Reserved {
			over = append(over, it.item)
			continue
		}
		first := 0
		if b.LookBack > 0 {
			first = max(0, len(bins)-b.LookBack)
		}
		placed := false
		for i := first; i < len(bins); i++ {
			if it.size <= b.Capacity-used[i] {
				bins[i] = append(bins[i], it.item)
				used[i] += it.size
				placed = true
				break
			}
		}
		if !placed {
			start := it.size
			if len(bins) == 0 {
				start += b.Reserved
			}
			bins = append(bins, []T{it.item})
			used = append(used, start)
		}
	}
	return bins, over
}
