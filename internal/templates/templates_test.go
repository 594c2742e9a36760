package templates

import (
	"errors"
	"strings"
	"testing"
)

const digest = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

const file = `
templates:
- name: python
  image: localhost:5000/fusebox/python:3.11` + digest + `
  limits: {cpu: 500m, cpuQuota: "2", memory: 1Gi, pids: 256, workspace: 256Mi, processes: 8, processBuffer: 4Mi}
  env: {PIP_NO_INDEX: "1", LANG: C.UTF-8}
  cwd: /workspace/app
  user: "1000:1000"
  warmUp:
  - argv: [python3, -c, import json]
  - script: echo ready > /tmp/warm
  pool: {min: 1, max: 8, estimator: ewma}
- name: alpine
  image: /var/lib/fusebox/layouts/alpine` + digest + `
`

func TestParse(t *testing.T) {
	specs, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 {
		t.Fatalf("got %d templates, want 2", len(specs))
	}
	py := specs[0]
	if py.Name != "python" || py.Limits.Memory != "1Gi" || py.Limits.Pids != 256 || py.Env["LANG"] != "C.UTF-8" ||
		py.Cwd != "/workspace/app" || len(py.WarmUp) != 2 || py.WarmUp[1].Script == "" || py.Pool.Max != 8 {
		t.Errorf("python parsed as %+v", py)
	}
	if e, lo, hi := specs[1].Pool.Sizes(); e != "fixed" || lo != 0 || hi != 0 {
		t.Errorf("alpine's pool sizes: %s %d %d, want fixed 0 0", e, lo, hi)
	}
	if _, ok := Find(specs, "alpine"); !ok {
		t.Error("Find(alpine) found nothing")
	}
	// The stack key's list, in JSON as Pulumi hands structured config over.
	list, err := ParseList([]byte(`[{"name":"node","image":"registry.example.com/node`+digest+`","pool":{"min":2}}]`), "fusebox:templates")
	if err != nil || len(list) != 1 || list[0].Pool.Min != 2 {
		t.Fatalf("ParseList: %+v, %v", list, err)
	}
	if list, err := ParseList(nil, "fusebox:templates"); err != nil || len(list) != 0 {
		t.Errorf("an empty stack key: %+v, %v", list, err)
	}
}

// TestInvalid: each bad input is refused with an error that names the entry and the field.
func TestInvalid(t *testing.T) {
	img := "localhost:5000/x" + digest
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", "templates:\n- name: a\n  image: " + img + "\n  limits: {memroy: 1Gi}\n", `unknown field "memroy"`},
		{"no list", "template: []\n", `unknown field "template"`},
		{"no templates key", "{}\n", `no "templates" list`},
		{"no name", "templates:\n- image: " + img + "\n", "templates[0]: name is required"},
		{"default", "templates:\n- name: default\n  image: " + img + "\n", `templates[0] (default): name "default" is the built-in template`},
		{"bad name", "templates:\n- name: Py_3\n  image: " + img + "\n", `name "Py_3": want lower-case`},
		{"duplicate", "templates:\n- name: a\n  image: " + img + "\n- name: a\n  image: " + img + "\n", `templates[1] (a): name "a" is already templates[0]'s`},
		{"no image", "templates:\n- name: a\n", "image is required"},
		{"tag only", "templates:\n- name: a\n  image: localhost:5000/x:latest\n", "is not pinned by digest"},
		{"no host", "templates:\n- name: a\n  image: library/python" + digest + "\n", "names its host"},
		{"relative layout", "templates:\n- name: a\n  image: ./layout" + digest + "\n", "names its host"},
		{"bad quantity", "templates:\n- name: a\n  image: " + img + "\n  limits: {memory: 1GB}\n", `limits.memory "1GB" is not a quantity`},
		{"small memory", "templates:\n- name: a\n  image: " + img + "\n  limits: {memory: 64Mi}\n", "limits.memory 64Mi is below 128Mi"},
		{"cpu", "templates:\n- name: a\n  image: " + img + "\n  limits: {cpu: \"300\"}\n", "limits.cpu 300 is outside"},
		{"quota below weight", "templates:\n- name: a\n  image: " + img + "\n  limits: {cpu: \"2\", cpuQuota: \"1\"}\n", "limits.cpuQuota 1 is below limits.cpu 2"},
		{"negative", "templates:\n- name: a\n  image: " + img + "\n  limits: {workspace: -1Mi}\n", "limits.workspace -1Mi is negative"},
		{"workspace", "templates:\n- name: a\n  image: " + img + "\n  limits: {memory: 1Gi, workspace: 1Gi}\n", "more than 7/8 of limits.memory"},
		{"pids", "templates:\n- name: a\n  image: " + img + "\n  limits: {pids: 4}\n", "limits.pids 4 is below 16"},
		{"processes", "templates:\n- name: a\n  image: " + img + "\n  limits: {processes: 5000}\n", "limits.processes 5000 is outside 1 to 4096"},
		{"process buffer", "templates:\n- name: a\n  image: " + img + "\n  limits: {processBuffer: 1Ki}\n", "limits.processBuffer 1Ki is outside 4Ki to 256Mi"},
		{"env key", "templates:\n- name: a\n  image: " + img + "\n  env: {1X: y}\n", `env: "1X" is not a variable name`},
		{"cwd", "templates:\n- name: a\n  image: " + img + "\n  cwd: work\n", `cwd "work": want a clean absolute path`},
		{"user", "templates:\n- name: a\n  image: " + img + "\n  user: \"a b\"\n", `user "a b"`},
		{"warm-up both", "templates:\n- name: a\n  image: " + img + "\n  warmUp: [{argv: [true], script: 'true'}]\n", "warmUp[0]: argv or script, not both"},
		{"warm-up none", "templates:\n- name: a\n  image: " + img + "\n  warmUp: [{}]\n", "warmUp[0]: argv or script is required"},
		{"pool", "templates:\n- name: a\n  image: " + img + "\n  pool: {min: 4, max: 2}\n", "pool: max 2 is below min 4"},
		{"estimator", "templates:\n- name: a\n  image: " + img + "\n  pool: {estimator: lstm}\n", `pool.estimator "lstm": want one of fixed, ewma, pid`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

// TestHash: a template's hash changes with what its sandboxes are made from, and not with its
// name, its pool, the order of its env or how a quantity is spelt.
func TestHash(t *testing.T) {
	specs, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	base := specs[0]
	same := base
	same.Name, same.Pool = "other", Pool{Min: 5, Max: 9}
	same.Limits.Memory = "1024Mi"
	same.Limits.ProcessBuffer = "4096Ki"
	same.Env = map[string]string{"LANG": "C.UTF-8", "PIP_NO_INDEX": "1"}
	if base.Hash() != same.Hash() {
		t.Error("the hash changed with the name, the pool or a quantity's spelling")
	}
	for name, change := range map[string]func(*Spec){
		"image":     func(s *Spec) { s.Image = "localhost:5000/fusebox/python:3.12" + digest },
		"memory":    func(s *Spec) { s.Limits.Memory = "2Gi" },
		"pids":      func(s *Spec) { s.Limits.Pids = 512 },
		"processes": func(s *Spec) { s.Limits.Processes = 9 },
		"buffer":    func(s *Spec) { s.Limits.ProcessBuffer = "8Mi" },
		"env":       func(s *Spec) { s.Env = map[string]string{"LANG": "C"} },
		"cwd":       func(s *Spec) { s.Cwd = "/workspace" },
		"user":      func(s *Spec) { s.User = "1001" },
		"warm-up":   func(s *Spec) { s.WarmUp = s.WarmUp[:1] },
	} {
		s := base
		change(&s)
		if s.Hash() == base.Hash() {
			t.Errorf("the hash did not change with the %s", name)
		}
	}
}
