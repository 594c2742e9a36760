// Package procstat reads the host's process table (/proc/<pid>/stat) for tests that check
// which processes run: a process tree killed, a zombie reaped, a child started.
package procstat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stat is what /proc/<pid>/stat tells of one process (the fields tests use).
type Stat struct {
	PID   int
	Comm  string // the command name, without the parentheses
	State byte   // 'R', 'S', 'D', 'Z' (a zombie), 'T', ...
	PPID  int
	PGRP  int // the process group
}

// Read returns the stat line of process pid. The error wraps fs.ErrNotExist when no such
// process exists (any longer).
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	return Parse(string(b))
}

// Parse parses a /proc/<pid>/stat line: "pid (comm) state ppid pgrp ...". The command name
// may hold spaces and parentheses, so it ends at the last ')'.
func Parse(line string) (Stat, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return Stat{}, fmt.Errorf("parsing /proc stat line %q: no (comm)", line)
	}
	f := strings.Fields(line[end+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("parsing /proc stat line %q: too few fields", line)
	}
	st := Stat{Comm: line[open+1 : end], State: f[0][0]}
	for _, n := range []struct {
		dst *int
		s   string
	}{{&st.PID, strings.TrimSpace(line[:open])}, {&st.PPID, f[1]}, {&st.PGRP, f[2]}} {
		v, err := strconv.Atoi(n.s)
		if err != nil {
			return Stat{}, fmt.Errorf("parsing /proc stat line %q: %w", line, err)
		}
		*n.dst = v
	}
	return st, nil
}

// Alive reports whether process pid runs: it exists and is not a zombie.
func Alive(pid int) bool {
	st, err := Read(pid)
	return err == nil && st.State != 'Z'
}

// All returns the processes of the host (of this PID namespace); those that end while they
// are listed are left out.
func All() []Stat {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []Stat
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, err := Read(pid); err == nil {
			out = append(out, st)
		}
	}
	return out
}
