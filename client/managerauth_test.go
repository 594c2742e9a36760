package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTCPManagerWithoutTLSIsRefusedClearly(t *testing.T) {
	_, err := NewManager("tcp://127.0.0.1:9090", nil)
	if !errors.Is(err, ErrNoManagerTLS) || !strings.Contains(err.Error(), "--ca-file") {
		t.Fatalf("NewManager(tcp, no TLS) = %v", err)
	}
	_, err = Allocate(context.Background(), "tcp://127.0.0.1:9090", AllocateOptions{})
	if !errors.Is(err, ErrNoManagerTLS) {
		t.Fatalf("Allocate(tcp, no TLS) = %v", err)
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, []byte("not a certificate"), 0o600)
	if _, err := NewManager("tcp://127.0.0.1:9090", nil, WithCAFile(ca)); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Fatalf("bad CA file: %v", err)
	}
	if _, err := NewManager("tcp://127.0.0.1:9090", nil, WithCAFile("/nonexistent/ca.crt")); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.crt") {
		t.Fatalf("missing CA file: %v", err)
	}
}

func TestTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tf := &tokenFile{path: path}
	md, err := tf.GetRequestMetadata(context.Background())
	if err != nil || md["authorization"] != "Bearer one" {
		t.Fatalf("metadata %v, %v", md, err)
	}
	// The kubelet swaps the file (a new inode, a new modification time).
	os.WriteFile(path+".new", []byte("two"), 0o600)
	os.Chtimes(path+".new", time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	os.Rename(path+".new", path)
	if md, _ := tf.GetRequestMetadata(context.Background()); md["authorization"] != "Bearer two" {
		t.Fatalf("after rotation: %v", md)
	}
	os.WriteFile(path, nil, 0o600)
	if _, err := tf.GetRequestMetadata(context.Background()); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty token file: %v", err)
	}
	if !tf.RequireTransportSecurity() {
		t.Fatal("a token may travel without TLS")
	}
	if _, err := NewManager("tcp://127.0.0.1:9090", nil, WithCAFile("/dev/null"), WithTokenFile("/nonexistent/token")); err == nil ||
		!strings.Contains(err.Error(), "manager token file") {
		t.Fatalf("missing token file: %v", err)
	}
}
