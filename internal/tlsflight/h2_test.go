package tlsflight

import (
	"bytes"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// recorder is a connection that records writes and serves reads from a buffer.
type recorder struct {
	net.Conn
	in      bytes.Buffer
	written bytes.Buffer
	writes  int
}

func (r *recorder) Read(p []byte) (int, error)  { return r.in.Read(p) }
func (r *recorder) Write(p []byte) (int, error) { r.writes++; return r.written.Write(p) }
func (r *recorder) Close() error                { return nil }

// clientStream is what grpc-go's client writes first: the preface, its SETTINGS and a
// WINDOW_UPDATE, then (after reading the server's first SETTINGS) the acknowledgement, a
// request's HEADERS, and later the acknowledgement of the server's real SETTINGS.
func clientStream(t testing.TB) (all, want []byte) {
	t.Helper()
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	b.WriteString(http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 8 << 20})
	fr.WriteWindowUpdate(0, 16<<20)
	fr.WritePing(false, [8]byte{0, 0, 0, 0x4, 0x1, 0, 0, 0})
	fr.WriteData(3, false, bytes.Repeat(settingsAck[:], 3)) // an acknowledgement's bytes inside a payload pass
	head := b.Len()
	fr.WriteSettingsAck()
	ackEnd := b.Len()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: bytes.Repeat([]byte{0x82}, 300), EndHeaders: true})
	fr.WriteData(1, true, bytes.Repeat(settingsAck[:], 40))
	fr.WriteSettingsAck()
	all = bytes.Clone(b.Bytes())
	want = append(bytes.Clone(all[:head]), all[ackEnd:]...)
	return all, want
}

func TestDefaultsDropsOnlyTheFirstAck(t *testing.T) {
	all, want := clientStream(t)
	for _, chunk := range []int{1, 2, 5, 9, 10, 24, 33, 100, len(all)} {
		r := &recorder{}
		requested := 0
		d := newDefaults(r, func() { requested++ })
		for rest := all; len(rest) > 0; {
			n := min(chunk, len(rest))
			if m, err := d.Write(rest[:n]); err != nil || m != n {
				t.Fatalf("chunk %d: Write = %d, %v", chunk, m, err)
			}
			rest = rest[n:]
		}
		if !bytes.Equal(r.written.Bytes(), want) {
			t.Errorf("chunk %d: wrote %d bytes, want %d with exactly the first SETTINGS ACK removed", chunk, r.written.Len(), len(want))
		}
		if requested != 1 {
			t.Errorf("chunk %d: the first request was reported %d times, want once", chunk, requested)
		}
	}
}

func TestDefaultsReadsAnEmptySettingsFrameFirst(t *testing.T) {
	r := &recorder{}
	fr := http2.NewFramer(&r.in, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 8 << 20})
	d := newDefaults(r, nil)
	rf := http2.NewFramer(nil, d)
	f, err := rf.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := f.(*http2.SettingsFrame); !ok || s.IsAck() || s.NumSettings() != 0 {
		t.Fatalf("first frame %v, want an empty SETTINGS frame", f)
	}
	f, err = rf.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := f.(*http2.SettingsFrame); !ok || s.NumSettings() != 1 {
		t.Fatalf("second frame %v, want the server's SETTINGS", f)
	}
}

// lockedRecorder is a recorder safe for the flush timer's concurrent write.
type lockedRecorder struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (r *lockedRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func (r *lockedRecorder) Close() error { return nil }

func (r *lockedRecorder) written() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// serverStream is what grpc-go's server writes first: its SETTINGS and a WINDOW_UPDATE, the
// acknowledgement of the client's SETTINGS, then the first response.
func serverStream(t *testing.T) (preface, response []byte) {
	t.Helper()
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
	fr.WriteWindowUpdate(0, 16<<20)
	fr.WriteSettingsAck()
	// A payload byte that looks like a HEADERS frame's type does not count.
	fr.WriteData(0, false, []byte{0, 0, 0, frameHeaders, 0, 0, 0, 0, 0})
	preface = bytes.Clone(b.Bytes())
	b.Reset()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}, EndHeaders: true})
	fr.WriteData(1, true, []byte("response"))
	return preface, bytes.Clone(b.Bytes())
}

func TestServerHoldSendsThePrefaceWithTheFirstResponse(t *testing.T) {
	preface, response := serverStream(t)
	rec := &lockedRecorder{}
	h := newServerHold(rec)
	for i := 0; i < len(preface); i += 7 { // split anywhere, frame headers included
		if n, err := h.Write(preface[i:min(i+7, len(preface))]); err != nil || n != min(7, len(preface)-i) {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	if w := rec.written(); len(w) != 0 {
		t.Fatalf("%d writes before the response, want none", len(w))
	}
	h.Write(response)
	h.Write([]byte("later"))
	want := [][]byte{append(bytes.Clone(preface), response...), []byte("later")}
	if w := rec.written(); !slices.EqualFunc(w, want, bytes.Equal) {
		t.Fatalf("writes %q, want %q", w, want)
	}
}

func TestServerHoldFlushesWithoutAResponse(t *testing.T) {
	preface, _ := serverStream(t)
	rec := &lockedRecorder{}
	h := newServerHold(rec)
	h.Write(preface)
	for deadline := time.Now().Add(10 * time.Second); len(rec.written()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the held preface was never sent")
		}
	}
	if w := rec.written(); len(w) != 1 || !bytes.Equal(w[0], preface) {
		t.Fatalf("writes %q, want the preface once", w)
	}
	h.Write([]byte("next"))
	if w := rec.written(); len(w) != 2 || string(w[1]) != "next" {
		t.Fatalf("writes after the flush: %q", w)
	}
}
