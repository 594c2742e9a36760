package jsonfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRoundTripLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.json")
	if err := Write(p, map[string]string{"a": "1"}); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := Read(p, &got); err != nil || got["a"] != "1" {
		t.Fatalf("Read = %v, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "x.json"), 1); err == nil {
		t.Fatal("wrote into a missing directory")
	}
}
