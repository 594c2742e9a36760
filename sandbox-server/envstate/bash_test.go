package envstate

import (
	"maps"
	"os"
	"os/exec"
	"testing"
)

// TestParseBashDumpAgainstRealBash runs the real trap in bash with hostile values and checks
// that every exported variable round-trips byte for byte.
func TestParseBashDumpAgainstRealBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on this machine") // fusebox falls back to sh without state capture
	}
	want := map[string]string{
		"PLAIN":   "hello world",
		"NEWLINE": "a\nb\n",
		"QUOTES":  `q"u$o` + "`t\\e'single'",
		"CTRL":    "\x01\x02\x1b[0m\t\r\v\f\a\b",
		"EMPTY":   "",
		"UTF8":    "héllo ✓ 日本",
		"HIGH":    "\xff\xfe raw bytes",
		"EQ":      "a=b=c",
		"DOLLAR":  "$'not ansi'",
	}
	script := BashTrap
	for k := range want {
		script += "export " + k + "=\"$IN_" + k + "\"\n"
	}
	script += "cd /tmp\nunset GONE\nexport -n HIDDEN\nexport NOVALUE\nexit 3\n"
	dump, err := os.CreateTemp(t.TempDir(), "dump")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, "-c", script)
	cmd.Env = []string{"GONE=1", "HIDDEN=1", "PATH=/usr/bin:/bin"}
	for k, v := range want {
		cmd.Env = append(cmd.Env, "IN_"+k+"="+v)
	}
	cmd.ExtraFiles = []*os.File{dump}
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit status not preserved: %v", err)
	}
	b, _ := os.ReadFile(dump.Name())
	d, err := ParseBashDump(b)
	if err != nil {
		t.Fatalf("ParseBashDump: %v\n%q", err, b)
	}
	env := d.Env
	if d.Cwd != "/tmp" || !d.CwdChanged {
		t.Errorf("cwd = %q changed %v", d.Cwd, d.CwdChanged)
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for _, k := range []string{"GONE", "HIDDEN", "NOVALUE"} {
		if _, ok := env[k]; ok {
			t.Errorf("%s should not be exported: %q", k, env[k])
		}
	}
}

func TestParseBashDumpFormats(t *testing.T) {
	in := "/w\x000\x00declare -x A=\"x\\\"y\"\ndeclare -rx B=$'\\101\\x42\\u00e9\\cA'\ndeclare -x C\ndeclare -x D=\"multi\nline\"\n"
	d, err := ParseBashDump([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": `x"y`, "B": "ABé\x01", "D": "multi\nline"}
	if d.Cwd != "/w" || d.CwdChanged || !maps.Equal(d.Env, want) {
		t.Fatalf("got %+v", d)
	}
	for _, bad := range []string{"", "no-nul", "/w\x00", "/w\x002\x00", "/w\x000\x00garbage\n", "/w\x000\x00declare -x A=\"open\n", "/w\x000\x00declare -x A=$'open"} {
		if _, err := ParseBashDump([]byte(bad)); err == nil {
			t.Errorf("ParseBashDump(%q) accepted", bad)
		}
	}
}

func FuzzParseBashDump(f *testing.F) {
	f.Add([]byte("/w\x001\x00declare -x A=\"x\"\n"))
	f.Add([]byte("/w\x000\x00declare -x A=$'\\x41\\u1234\\777'\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseBashDump(b) // must not panic
	})
}
