package process

import "sort"

// Stream says which of a process's outputs a chunk came from.
type Stream uint8

const (
	Stdout Stream = iota + 1
	Stderr
)

// maxChunk bounds how many bytes of one stream consecutive writes merge into one chunk: a
// chunk is what one Attach event carries.
const maxChunk = 64 << 10

// Chunk is a run of output from one stream, at an absolute offset.
type Chunk struct {
	Offset uint64
	Stream Stream
	Data   []byte
}

// End is the offset after the chunk's last byte.
func (c Chunk) End() uint64 { return c.Offset + uint64(len(c.Data)) }

// ring holds the last max bytes a process wrote to stdout and stderr together, in arrival
// order, as chunks tagged by stream with absolute offsets. The bytes of a chunk are never
// changed once written (writes append past a chunk's length or to a new chunk, and dropping
// old output only reslices), so a reader may keep the slices it was given after the lock
// that guarded the ring is released.
type ring struct {
	max    int
	chunks []Chunk // in offset order, contiguous; the first starts at end-size
	size   int     // bytes held
	end    uint64  // offset after the last byte ever written
}

// start is the offset of the oldest byte held.
func (r *ring) start() uint64 { return r.end - uint64(r.size) }

// write appends b (copied) as output of stream s, dropping the oldest bytes beyond max.
func (r *ring) write(s Stream, b []byte) {
	if len(b) == 0 {
		return
	}
	if len(b) > r.max {
		// Everything held and the head of b are dropped at once.
		skip := len(b) - r.max
		r.end += uint64(skip)
		b = b[skip:]
		clear(r.chunks)
		r.chunks, r.size = r.chunks[:0], 0
	}
	if n := len(r.chunks); n > 0 && r.chunks[n-1].Stream == s && len(r.chunks[n-1].Data)+len(b) <= maxChunk {
		r.chunks[n-1].Data = append(r.chunks[n-1].Data, b...)
	} else {
		data := make([]byte, len(b), max(len(b), min(4<<10, r.max)))
		copy(data, b)
		r.chunks = append(r.chunks, Chunk{Offset: r.end, Stream: s, Data: data})
	}
	r.end += uint64(len(b))
	r.size += len(b)
	for r.size > r.max {
		excess := r.size - r.max
		c := &r.chunks[0]
		if len(c.Data) <= excess {
			r.size -= len(c.Data)
			r.chunks[0] = Chunk{} // let the collector have its bytes
			r.chunks = r.chunks[1:]
			continue
		}
		c.Data = c.Data[excess:]
		c.Offset += uint64(excess)
		r.size -= excess
	}
}

// since returns the chunks holding the bytes from offset from on (the first one cut to
// start there); from must be within [start, end].
func (r *ring) since(from uint64) []Chunk {
	i := sort.Search(len(r.chunks), func(i int) bool { return r.chunks[i].End() > from })
	if i == len(r.chunks) {
		return nil
	}
	out := make([]Chunk, len(r.chunks)-i)
	copy(out, r.chunks[i:])
	if skip := from - out[0].Offset; skip > 0 {
		out[0].Data = out[0].Data[skip:]
		out[0].Offset = from
	}
	return out
}
