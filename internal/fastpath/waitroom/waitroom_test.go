package waitroom

import (
	"net"
	"testing"
)

// Latest keeps the newest connection and closes the one it replaces.
func TestLatestKeepsTheNewest(t *testing.T) {
	var l Latest
	a1, a2 := net.Pipe()
	b1, b2 := net.Pipe()
	defer a2.Close()
	defer b2.Close()
	l.Keep(a1)
	l.Keep(b1)
	if _, err := a2.Read(make([]byte, 1)); err == nil {
		t.Error("the replaced connection is still open")
	}
	if c := l.Release(); c != b1 {
		t.Errorf("Release = %v, want the newest", c)
	}
	if c := l.Release(); c != nil {
		t.Errorf("second Release = %v, want nil", c)
	}
	l.Keep(a1)
	l.Close()
	if l.Release() != nil {
		t.Error("Close left a connection kept")
	}
}
