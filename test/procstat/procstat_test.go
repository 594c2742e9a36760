package procstat

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		line string
		want Stat
		ok   bool
	}{
		{"42 (sleep) S 1 42 42 0 -1 4194304", Stat{PID: 42, Comm: "sleep", State: 'S', PPID: 1, PGRP: 42}, true},
		{"7 (a) b (c)) Z 3 5 5 0\n", Stat{PID: 7, Comm: "a) b (c)", State: 'Z', PPID: 3, PGRP: 5}, true},
		{"9 (my prog) R 2 9", Stat{PID: 9, Comm: "my prog", State: 'R', PPID: 2, PGRP: 9}, true},
		{"", Stat{}, false},
		{"9 my prog R 2 9", Stat{}, false},
		{"9 (x) R 2", Stat{}, false},
		{"9 (x) RS 2 9", Stat{}, false},
		{"nine (x) R 2 9", Stat{}, false},
	}
	for _, tc := range tests {
		got, err := Parse(tc.line)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
		if !tc.ok && err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", tc.line, got)
		}
	}
}

// A child is seen running, in All as in Read, then as a zombie until it is waited for, then
// gone.
func TestLifeOfAChild(t *testing.T) {
	self, err := Read(os.Getpid())
	if err != nil || self.PID != os.Getpid() || !Alive(os.Getpid()) {
		t.Fatalf("Read(self) = %+v, %v", self, err)
	}
	cmd := exec.Command("sleep", "0.2")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	st, err := Read(pid)
	if err != nil || st.PPID != os.Getpid() || !Alive(pid) {
		t.Fatalf("child: %+v, %v, alive %v", st, err, Alive(pid))
	}
	if !slices.ContainsFunc(All(), func(s Stat) bool { return s.PID == pid }) {
		t.Fatal("All lacks the child")
	}
	// Not waited for, the ended child stays a zombie.
	for deadline := time.Now().Add(time.Minute); Alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the child still runs after a minute")
		}
	}
	if st, err := Read(pid); err != nil || st.State != 'Z' {
		t.Fatalf("ended child: %+v, %v; want a zombie", st, err)
	}
	cmd.Wait()
	if _, err := Read(pid); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reaped child: %v, want fs.ErrNotExist", err)
	}
}
