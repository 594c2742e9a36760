package runsc

import "testing"

func TestParseProcess(t *testing.T) {
	const root = "/var/lib/fusebox/runsc"
	tests := []struct {
		name string
		argv []string
		want Process
		ok   bool
	}{
		{"create", []string{"/usr/local/bin/runsc", "--root=" + root, "--network=none", "create", "--bundle=/b/1", "--pid-file=/b/1/pid", "fb-1"},
			Process{Pid: 7, Command: "create", Bundle: "/b/1"}, true},
		{"sandbox", []string{"runsc-sandbox", "--root=" + root + "/", "--debug=false", "boot", "--bundle=/b/2", "--controller-fd=3", "fb-2"},
			Process{Pid: 7, Command: "boot", Bundle: "/b/2"}, true},
		{"gofer, flags apart", []string{"runsc-gofer", "--root", root, "gofer", "--bundle", "/b/3", "--spec-fd=3"},
			Process{Pid: 7, Command: "gofer", Bundle: "/b/3"}, true},
		{"another root", []string{"runsc", "--root=/run/runsc", "boot", "--bundle=/b/4", "fb-4"}, Process{}, false},
		{"no root", []string{"runsc", "boot", "--bundle=/b/5"}, Process{}, false},
		{"no subcommand", []string{"runsc", "--root=" + root}, Process{}, false},
		{"not runsc", []string{"/bin/sleep", "30"}, Process{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseProcess(7, tt.argv, root)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("parseProcess(%q) = %+v, %v; want %+v, %v", tt.argv, got, ok, tt.want, tt.ok)
			}
		})
	}
}
