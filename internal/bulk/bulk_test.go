package bulk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func TestFramesRoundTrip(t *testing.T) {
	var wire bytes.Buffer
	size := int64(5)
	req := &sandboxv1.BulkRequest{Op: &sandboxv1.BulkRequest_Write{Write: &sandboxv1.WriteFileHeader{Path: "a/b", Mode: 0o600, Size: &size}}}
	if err := WriteMsg(&wire, req); err != nil {
		t.Fatal(err)
	}
	buf := NewChunk(8)
	copy(Data(buf), "hello")
	wire.Write(Frame(buf, 5))
	copy(Data(buf), "xy")
	wire.Write(Frame(buf, 2))
	wire.Write(EndChunk)

	var got sandboxv1.BulkRequest
	if err := ReadMsg(&wire, &got); err != nil {
		t.Fatal(err)
	}
	if h := got.GetWrite(); h.GetPath() != "a/b" || h.GetMode() != 0o600 || h.GetSize() != 5 {
		t.Fatalf("request = %v", &got)
	}
	in := make([]byte, MaxChunk)
	var data []byte
	for {
		b, err := ReadChunk(&wire, in)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	if string(data) != "helloxy" {
		t.Fatalf("data = %q", data)
	}
	if err := ReadMsg(&wire, &got); err != io.EOF {
		t.Fatalf("ReadMsg at the end = %v, want io.EOF", err)
	}
}

func TestMalformedFramesAreRefused(t *testing.T) {
	huge := binary.BigEndian.AppendUint32(nil, MaxChunk+1)
	if _, err := ReadChunk(bytes.NewReader(huge), make([]byte, MaxChunk)); !errors.Is(err, ErrFrame) {
		t.Errorf("oversized chunk: %v, want ErrFrame", err)
	}
	big := binary.BigEndian.AppendUint32(nil, maxControl+1)
	if err := ReadMsg(bytes.NewReader(big), &sandboxv1.BulkStatus{}); !errors.Is(err, ErrFrame) {
		t.Errorf("oversized control message: %v, want ErrFrame", err)
	}
	garbage := append(binary.BigEndian.AppendUint32(nil, 3), 0xff, 0xff, 0xff)
	if err := ReadMsg(bytes.NewReader(garbage), &sandboxv1.BulkStatus{}); !errors.Is(err, ErrFrame) {
		t.Errorf("undecodable control message: %v, want ErrFrame", err)
	}
	// A connection that ends inside a frame, or before the empty chunk, is no end of a file.
	cut := append(binary.BigEndian.AppendUint32(nil, 10), "abc"...)
	if _, err := ReadChunk(bytes.NewReader(cut), make([]byte, MaxChunk)); err != io.ErrUnexpectedEOF {
		t.Errorf("chunk cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ReadChunk(bytes.NewReader(nil), make([]byte, MaxChunk)); err != io.ErrUnexpectedEOF {
		t.Errorf("no chunk at all: %v, want io.ErrUnexpectedEOF", err)
	}
	if err := WriteMsg(io.Discard, &sandboxv1.BulkStatus{Message: string(make([]byte, maxControl))}); !errors.Is(err, ErrFrame) {
		t.Errorf("writing an oversized control message: %v, want ErrFrame", err)
	}
}

func TestErrIsTheGRPCStatus(t *testing.T) {
	if err := Err(&sandboxv1.BulkStatus{Bytes: 3}); err != nil {
		t.Fatalf("OK status: %v", err)
	}
	err := Err(&sandboxv1.BulkStatus{Code: int32(codes.PermissionDenied), Message: `"../x" escapes the workspace`})
	if s, _ := status.FromError(err); s.Code() != codes.PermissionDenied || s.Message() != `"../x" escapes the workspace` {
		t.Fatalf("Err = %v", err)
	}
}
