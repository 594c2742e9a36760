package portfwd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, port := range []uint32{0, 1, 3000, 65535, 65536, 1<<32 - 1} {
		b := Request{Port: port}.Append(nil)
		if len(b) != RequestLen {
			t.Fatalf("port %d: %d bytes, want %d", port, len(b), RequestLen)
		}
		got, err := ReadRequest(bytes.NewReader(b))
		if err != nil || got.Port != port {
			t.Fatalf("port %d: got %v, %v", port, got, err)
		}
	}
}

func TestReadRequestErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"short", []byte{Version, 0, 0}, io.ErrUnexpectedEOF},
		{"version", []byte{2, 0, 0, 0x0b, 0xb8}, ErrFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ReadRequest(bytes.NewReader(tc.in)); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCheckPort(t *testing.T) {
	for _, tc := range []struct {
		port int64
		ok   bool
	}{{0, false}, {-1, false}, {1, true}, {3000, true}, {65535, true}, {65536, false}} {
		err := CheckPort(tc.port)
		if (err == nil) != tc.ok {
			t.Errorf("CheckPort(%d) = %v", tc.port, err)
		}
		if err != nil && !strings.Contains(err.Error(), "out of range 1-65535") {
			t.Errorf("CheckPort(%d) = %q: the message should give the range", tc.port, err)
		}
	}
}

func TestAnswerRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   error
		code codes.Code
		msg  string
	}{
		{"connected", nil, codes.OK, ""},
		{"refused", status.Error(codes.Unavailable, "nothing listens on port 3000 inside the sandbox"), codes.Unavailable, "nothing listens on port 3000 inside the sandbox"},
		{"plain error", errors.New("boom"), codes.Unknown, "boom"},
		{"long message", status.Error(codes.InvalidArgument, strings.Repeat("x", 2*MaxMessage)), codes.InvalidArgument, strings.Repeat("x", MaxMessage)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wire bytes.Buffer
			if err := WriteAnswer(&wire, tc.in); err != nil {
				t.Fatal(err)
			}
			wire.WriteString("after")
			err := ReadAnswer(&wire)
			if tc.code == codes.OK {
				if err != nil {
					t.Fatalf("got %v, want connected", err)
				}
			} else if st, ok := status.FromError(err); !ok || st.Code() != tc.code || st.Message() != tc.msg {
				t.Fatalf("got %v, want %v %q", err, tc.code, tc.msg)
			}
			if rest := wire.String(); rest != "after" {
				t.Fatalf("answer read too much or too little: %q left", rest)
			}
		})
	}
}

func TestReadAnswerBroken(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"short header", []byte{0}, io.ErrUnexpectedEOF},
		{"short message", []byte{14, 0, 5, 'a'}, io.ErrUnexpectedEOF},
		{"oversized", []byte{14, 0xff, 0xff}, ErrFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ReadAnswer(bytes.NewReader(tc.in))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if _, ok := status.FromError(err); ok {
				t.Fatalf("a broken answer must not read as a refusal: %v", err)
			}
		})
	}
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// Pipe carries both directions, large and small writes alike, and passes each half-close on:
// a peer that answers after reading to the end gets its answer through.
func TestPipeHalfClose(t *testing.T) {
	leakcheck.Check(t)
	agent, a := tcpPair(t)
	b, program := tcpPair(t)
	piped := make(chan error, 1)
	go func() { piped <- Pipe(a, b, 64<<10) }()
	go func() {
		got, _ := io.ReadAll(program) // to the agent's half-close
		program.Write(bytes.ToUpper(got))
		program.CloseWrite()
	}()
	msg := bytes.Repeat([]byte("abcdefgh"), 1<<17) // 1 MiB, more than is held between read and write
	if _, err := agent.Write(msg); err != nil {
		t.Fatal(err)
	}
	agent.CloseWrite()
	got, err := io.ReadAll(agent)
	if err != nil || !bytes.Equal(got, bytes.ToUpper(msg)) {
		t.Fatalf("answer of %d bytes (%v), want the %d sent, upper-cased", len(got), err, len(msg))
	}
	if err := <-piped; err != nil {
		t.Fatalf("Pipe: %v", err)
	}
}

// When one side breaks, Pipe closes both and returns the error.
func TestPipeBroken(t *testing.T) {
	leakcheck.Check(t)
	agent, a := tcpPair(t)
	b, program := tcpPair(t)
	piped := make(chan error, 1)
	go func() { piped <- Pipe(a, b, 64<<10) }()
	agent.Write([]byte("x"))
	program.SetLinger(0)
	program.Close() // a reset: the agent's next bytes cannot be written
	for range 100 {
		if _, err := agent.Write([]byte("more")); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-piped; err == nil {
		t.Fatal("Pipe over a reset connection returned nil")
	}
	agent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(agent); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("the agent's side after the break: %v, want it closed", err)
	}
}
