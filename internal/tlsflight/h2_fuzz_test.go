package tlsflight

import (
	"bytes"
	"io"
	"testing"
)

// wantDefaults is the model of defaults' write side: the stream with the first SETTINGS
// acknowledgement among the frames before the first HEADERS (or among all frames, without a
// request callback) removed, and whether a HEADERS frame was found. A frame header still
// incomplete at the end of the stream is held, not written.
func wantDefaults(in []byte, withRequest bool) (out []byte, headers bool) {
	if len(in) <= clientPrefaceLen {
		return bytes.Clone(in), false
	}
	out = bytes.Clone(in[:clientPrefaceLen])
	rest := in[clientPrefaceLen:]
	acked := false
	for len(rest) > 0 {
		if acked && (headers || !withRequest) {
			return append(out, rest...), headers
		}
		if len(rest) < 9 {
			return out, headers // held until the header completes
		}
		head := rest[:9]
		size := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		if !acked && [9]byte(head) == settingsAck {
			acked = true
			rest = rest[9:]
			continue
		}
		if head[3] == frameHeaders {
			headers = true
		}
		n := min(9+size, len(rest))
		out, rest = append(out, rest[:n]...), rest[n:]
	}
	return out, headers
}

// chunks splits in at the sizes cuts gives (cycled; 0 counts as 1).
func chunks(in, cuts []byte) [][]byte {
	var out [][]byte
	for i := 0; len(in) > 0; i++ {
		n := 1
		if len(cuts) > 0 {
			n = int(cuts[i%len(cuts)]) + 1
		}
		n = min(n, len(in))
		out, in = append(out, in[:n]), in[n:]
	}
	return out
}

// FuzzDefaultsWrite checks the client side's frame rewriting against its model, whatever the
// bytes and however the writes split them: every byte passes in order except the one
// acknowledgement removed, and the request callback runs once, exactly when a HEADERS frame
// has been written.
func FuzzDefaultsWrite(f *testing.F) {
	all, _ := clientStream(f)
	f.Add(all, []byte{0}, true)
	f.Add(all, []byte{8, 23, 99}, true)
	f.Add(all, []byte{255}, false)
	f.Add(append(bytes.Repeat([]byte{'P'}, clientPrefaceLen), settingsAck[:5]...), []byte{3}, true)
	f.Add(append(append(make([]byte, clientPrefaceLen), 0xff, 0xff, 0xff, frameHeaders, 0, 0, 0, 0, 1), settingsAck[:]...), []byte{1}, true)
	f.Fuzz(func(t *testing.T, in, cuts []byte, withRequest bool) {
		r := &recorder{}
		requested := 0
		var request func()
		if withRequest {
			request = func() { requested++ }
		}
		d := newDefaults(r, request)
		for _, c := range chunks(in, cuts) {
			if n, err := d.Write(c); err != nil || n != len(c) {
				t.Fatalf("Write(%d bytes) = %d, %v", len(c), n, err)
			}
		}
		want, headers := wantDefaults(in, withRequest)
		if !bytes.Equal(r.written.Bytes(), want) {
			t.Fatalf("wrote %x\nwant %x", r.written.Bytes(), want)
		}
		if wantCalls := map[bool]int{true: 1}[headers && withRequest]; requested != wantCalls {
			t.Fatalf("request callback ran %d times, want %d (HEADERS seen: %v)", requested, wantCalls, headers)
		}
	})
}

// FuzzDefaultsRead checks the read side: whatever the read sizes, the reader gets the empty
// SETTINGS frame and then the connection's bytes, unchanged.
func FuzzDefaultsRead(f *testing.F) {
	f.Add([]byte("server frames"), []byte{0})
	f.Add([]byte{}, []byte{3, 7})
	f.Add(bytes.Repeat([]byte{0x4}, 100), []byte{8, 200})
	f.Fuzz(func(t *testing.T, in, sizes []byte) {
		r := &recorder{}
		r.in.Write(in)
		d := newDefaults(r, nil)
		var got []byte
		for i := 0; ; i++ {
			n := 1
			if len(sizes) > 0 {
				n = int(sizes[i%len(sizes)]) + 1
			}
			buf := make([]byte, n)
			m, err := d.Read(buf)
			got = append(got, buf[:m]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if want := append(bytes.Clone(emptySettings), in...); !bytes.Equal(got, want) {
			t.Fatalf("read %x, want %x", got, want)
		}
	})
}

// FuzzServerHold checks the server side's held writes: whatever the frames and however the
// writes split them, the connection receives every byte once, in order, by Close.
func FuzzServerHold(f *testing.F) {
	all, _ := clientStream(f)
	f.Add(all[clientPrefaceLen:], []byte{0})
	f.Add(all[clientPrefaceLen:], []byte{8, 100})
	f.Add([]byte{0, 0, 0, frameHeaders, 0, 0, 0, 0, 1}, []byte{2})
	f.Add([]byte{0xff, 0xff, 0xff, 0x0, 0, 0, 0, 0, 1, 0, 0, 0, frameHeaders}, []byte{4})
	f.Fuzz(func(t *testing.T, in, cuts []byte) {
		r := &lockedRecorder{}
		h := newServerHold(r)
		for _, c := range chunks(in, cuts) {
			if n, err := h.Write(c); err != nil || n != len(c) {
				t.Fatalf("Write(%d bytes) = %d, %v", len(c), n, err)
			}
		}
		h.Close()
		if got := bytes.Join(r.written(), nil); !bytes.Equal(got, in) {
			t.Fatalf("connection got %x\nwant %x", got, in)
		}
	})
}
