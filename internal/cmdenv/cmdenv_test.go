package cmdenv

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, ok := range []struct {
		env map[string]string
		cwd string
	}{{nil, ""}, {map[string]string{"A_1": "x=y", "_B": ""}, "/srv/app"}, {nil, "src/app"}, {nil, "."}} {
		if err := Check(ok.env, ok.cwd); err != nil {
			t.Errorf("Check(%v, %q): %v", ok.env, ok.cwd, err)
		}
	}
	big := map[string]string{}
	for i := range MaxVars + 1 {
		big["V"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("y", i/26)] = "1"
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		cwd  string
		want string
	}{
		"digit first": {map[string]string{"1A": "x"}, "", `"1A" is not a variable name`},
		"equals":      {map[string]string{"A=B": "x"}, "", "is not a variable name"},
		"NUL":         {map[string]string{"A": "x\x00"}, "", "NUL byte"},
		"too many":    {big, "", "environment variables, at most"},
		"too big":     {map[string]string{"A": strings.Repeat("x", MaxBytes)}, "", "bytes, at most"},
		"unclean":     {nil, "/srv//app/", "not a clean path"},
		"climbs":      {nil, "../etc", "leaves the workspace"},
		"NUL cwd":     {nil, "/a\x00", "NUL byte"},
	} {
		err := Check(tc.env, tc.cwd)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an ErrInvalid saying %q", name, err, tc.want)
		}
	}
}
