package tlsflight

import (
	"bytes"
	"net"
	"testing"

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
func clientStream(t *testing.T) (all, want []byte) {
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
