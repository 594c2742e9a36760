package fastpath

import "testing"

func TestParseAndString(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Switches
		str  string
	}{
		{"all", All(), "all"},
		{"none", Switches{}, "none"},
		{"", Switches{}, "none"},
		{" keep-awake", All(), "all"},
		{"keep-awake,keep-awake", All(), "all"},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if s := got.String(); s != tc.str {
			t.Errorf("String of %+v = %q, want %q", got, s, tc.str)
		}
		if back, err := Parse(got.String()); err != nil || back != got {
			t.Errorf("Parse(String()) of %+v = %+v, %v", got, back, err)
		}
	}
	for _, bad := range []string{"fast", "keep-awake,turbo", "ALL", "pool-procs", "relay", "handoff", "early-naming", "early-naming,keep-awake", "relay,handoff,keep-awake"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
		}
	}
	if (Switches{}).Any() || !(Switches{KeepAwake: true}).Any() {
		t.Error("Any is wrong")
	}
}

// Set, the flags' parser, ignores a retired accelerator's name, which a value written for an
// earlier release may hold, and refuses an unknown one.
func TestSetIgnoresRetiredNames(t *testing.T) {
	for in, want := range map[string]Switches{
		"pool-procs":                            {},
		"relay":                                 {},
		"handoff":                               {},
		"early-naming":                          {},
		"relay, pool-procs":                     {},
		"keep-awake, relay":                     {KeepAwake: true},
		"early-naming, keep-awake":              {KeepAwake: true},
		"relay,handoff,keep-awake,pool-procs":   {KeepAwake: true},
		"relay,early-naming,keep-awake,handoff": All(),
		"all":                                   All(),
	} {
		s := All() // Set replaces what was there
		if err := s.Set(in); err != nil || s != want {
			t.Errorf("Set(%q) = %+v, %v; want %+v", in, s, err, want)
		}
	}
	var s Switches
	for _, bad := range []string{"pool-procs,turbo", "relay,turbo", "handoff,turbo", "early-naming,turbo"} {
		if err := s.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted it", bad)
		}
	}
}
