// Package templates defines what a sandbox template is: a name, an OCI image pinned by digest,
// the limits, environment, working directory and user of each sandbox made from it, commands
// that warm it up, and the size of its warm pool.
//
// One schema and one validation serve both places a template is declared: the manager's
// templates file locally (fusebox local up --templates FILE) and the stack key
// fusebox:templates in a cluster. A file is YAML (or JSON) with a list under "templates"; the
// stack key holds the list itself. Unknown keys are refused, so that a misspelt limit is an
// error rather than a default.
//
// A template's Hash covers what a sandbox is made from (image, limits, env, working directory,
// user, warm-up), not its pool's size: warm units of another hash are outdated and replaced,
// while a pool that only grows or shrinks keeps its units.
package templates

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/internal/cmdenv"
)

// Default is the built-in template: the sandbox image the manager was started with, limited by
// its --sandbox-* flags (locally) or the stack's sandbox keys (in a cluster). A file cannot
// redefine it.
const Default = "default"

// ErrInvalid is wrapped by every error of Parse, ParseList and Validate.
var ErrInvalid = errors.New("invalid template")

// Spec is one template as declared.
type Spec struct {
	// Name identifies the template in Allocate, the authorisation policy and the pools: a DNS
	// label of at most MaxNameLen characters, not Default.
	Name string `json:"name"`
	// Image is the OCI image, pinned by digest: a registry reference
	// HOST[:PORT]/PATH[:TAG]@sha256:HEX, or (locally) an OCI image layout directory
	// /ABS/PATH@sha256:HEX naming the manifest to use.
	Image string `json:"image"`
	// Limits of each sandbox; a field left out takes the manager's value for the default
	// template.
	Limits Limits `json:"limits,omitzero"`
	// Env is set in every command's environment, over the image's; Allocate's env is set over
	// it.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the commands' working directory (absolute); empty: the workspace. Allocate's
	// cwd wins over it.
	Cwd string `json:"cwd,omitempty"`
	// User runs the commands: "NAME", "UID", "UID:GID" or "NAME:GROUP", names looked up in
	// the image's /etc/passwd and /etc/group; empty means the image's USER locally, and the
	// sandbox user (65532) in a cluster, where the pod does not run as the image's user.
	User string `json:"user,omitempty"`
	// WarmUp runs in order in each new sandbox before it joins the pool; a sandbox whose
	// warm-up fails is not handed out.
	WarmUp []Command `json:"warmUp,omitempty"`
	// Pool sizes the template's warm pool.
	Pool Pool `json:"pool,omitzero"`
}

// Limits are quantities as Kubernetes writes them ("500m", "1.5", "1Gi", "512Mi").
type Limits struct {
	// CPU is a weight in cores (cgroup cpu.shares; a pod's CPU request): it divides a busy
	// machine and costs nothing while a CPU is idle.
	CPU string `json:"cpu,omitempty"`
	// CPUQuota, if set, is a hard cap in cores (a CFS quota; a pod's CPU limit), at least CPU.
	CPUQuota string `json:"cpuQuota,omitempty"`
	// Memory is the whole sandbox's memory: gVisor's kernel, the processes and the
	// memory-backed workspace.
	Memory string `json:"memory,omitempty"`
	// Pids is how many tasks the commands may have at once.
	Pids int64 `json:"pids,omitempty"`
	// Workspace caps /workspace.
	Workspace string `json:"workspace,omitempty"`
	// Processes is how many long-lived processes (StartProcess) may run at once in a
	// sandbox; as many exited ones are kept for re-reading their output.
	Processes int `json:"processes,omitempty"`
	// ProcessBuffer is the output kept per long-lived process for Attach (stdout and stderr
	// together, the most recent), a quantity such as "4Mi".
	ProcessBuffer string `json:"processBuffer,omitempty"`
}

// Command is one warm-up step: an argv, or a script for the image's /bin/sh.
type Command struct {
	Argv   []string `json:"argv,omitempty"`
	Script string   `json:"script,omitempty"`
}

// Pool sizes a template's warm pool. The zero value keeps no warm unit: each allocation of
// the template makes its sandbox.
type Pool struct {
	// Min ready units (the fixed estimator's target, the adaptive ones' floor).
	Min int `json:"min,omitempty"`
	// Max is the most ready units an adaptive estimator may ask for (default Min).
	Max int `json:"max,omitempty"`
	// Estimator is "fixed" (the default), "ewma" or "pid".
	Estimator string `json:"estimator,omitempty"`
}

// Bounds of the values Validate accepts.
const (
	MaxNameLen     = 40
	MaxTemplates   = 64
	MaxWarmUp      = 16
	MaxPool        = 1000
	MaxEnv         = cmdenv.MaxVars
	MinMemoryBytes = 128 << 20 // room for gVisor's kernel, the server and a small workspace
	MinCPU         = 0.002     // the least cpu.shares (2) in cores
	MaxCPU         = 256       // the most cpu.shares (262144) in cores
	MinCPUQuota    = 0.01
	MinPids        = 16
	MinWorkspace   = 1 << 20
	MaxProcesses   = 4096
	// MinProcessBuffer and MaxProcessBuffer bound limits.processBuffer.
	MinProcessBuffer = 4 << 10
	MaxProcessBuffer = 256 << 20
)

// Estimators are the pool estimators a template may name.
var Estimators = []string{"fixed", "ewma", "pid"}

// File is a templates file.
type File struct {
	Templates []Spec `json:"templates"`
}

// Parse reads a templates file (YAML or JSON) and validates it.
func Parse(data []byte) ([]Spec, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%w: reading the templates file: %v", ErrInvalid, err)
	}
	if f.Templates == nil {
		return nil, fmt.Errorf("%w: the file has no \"templates\" list", ErrInvalid)
	}
	return f.Templates, Validate(f.Templates, "templates")
}

// ParseList reads a list of templates (the value of the stack key fusebox:templates, as
// JSON or YAML) and validates it; key names the list in errors.
func ParseList(data []byte, key string) ([]Spec, error) {
	var specs []Spec
	if len(bytes.TrimSpace(data)) > 0 {
		if err := yaml.UnmarshalStrict(data, &specs); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, key, err)
		}
	}
	return specs, Validate(specs, key)
}

// Validate checks every template of specs, and that their names differ; errors wrap
// ErrInvalid and name the entry and its field as key[i] (NAME).field.
func Validate(specs []Spec, key string) error {
	if len(specs) > MaxTemplates {
		return fmt.Errorf("%w: %s: %d templates, at most %d", ErrInvalid, key, len(specs), MaxTemplates)
	}
	seen := map[string]int{}
	for i, s := range specs {
		at := fmt.Sprintf("%s[%d]", key, i)
		if s.Name != "" {
			at += " (" + s.Name + ")"
		}
		if j, dup := seen[s.Name]; dup && s.Name != "" {
			return fmt.Errorf("%w: %s: name %q is already %s[%d]'s", ErrInvalid, at, s.Name, key, j)
		}
		seen[s.Name] = i
		if err := s.validate(); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, at, err)
		}
	}
	return nil
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	digestRE = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)
	hostRE   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?(:[0-9]{1,5})?$`)
	userRE   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$`)
)

func (s Spec) validate() error {
	switch {
	case s.Name == "":
		return errors.New("name is required")
	case s.Name == Default:
		return fmt.Errorf("name %q is the built-in template (the manager's own sandbox image and limits); choose another name", Default)
	case len(s.Name) > MaxNameLen || !nameRE.MatchString(s.Name):
		return fmt.Errorf("name %q: want lower-case letters, digits and '-', starting and ending with a letter or digit, at most %d characters", s.Name, MaxNameLen)
	}
	if err := checkImage(s.Image); err != nil {
		return err
	}
	if err := s.Limits.validate(); err != nil {
		return err
	}
	if len(s.Env) > MaxEnv {
		return fmt.Errorf("env: %d variables, at most %d", len(s.Env), MaxEnv)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		if !cmdenv.ValidName(k) {
			return fmt.Errorf("env: %q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return fmt.Errorf("env.%s: the value holds a NUL byte", k)
		}
	}
	if s.Cwd != "" && (!path.IsAbs(s.Cwd) || path.Clean(s.Cwd) != s.Cwd) {
		return fmt.Errorf("cwd %q: want a clean absolute path", s.Cwd)
	}
	if s.User != "" && !userRE.MatchString(s.User) {
		return fmt.Errorf("user %q: want NAME, UID, UID:GID or NAME:GROUP", s.User)
	}
	if len(s.WarmUp) > MaxWarmUp {
		return fmt.Errorf("warmUp: %d commands, at most %d", len(s.WarmUp), MaxWarmUp)
	}
	for i, c := range s.WarmUp {
		switch {
		case len(c.Argv) > 0 && c.Script != "":
			return fmt.Errorf("warmUp[%d]: argv or script, not both", i)
		case len(c.Argv) == 0 && c.Script == "":
			return fmt.Errorf("warmUp[%d]: argv or script is required", i)
		case len(c.Argv) > 0 && c.Argv[0] == "":
			return fmt.Errorf("warmUp[%d]: argv[0] is empty", i)
		}
	}
	return s.Pool.validate()
}

// checkImage checks that image is pinned by digest: a registry reference naming its host, or
// an absolute layout path.
func checkImage(image string) error {
	if image == "" {
		return errors.New("image is required (HOST[:PORT]/PATH@sha256:DIGEST, or an OCI layout /PATH@sha256:DIGEST)")
	}
	if !digestRE.MatchString(image) {
		return fmt.Errorf("image %q is not pinned by digest: append @sha256:DIGEST (`fusebox template build` and `crane digest` print it)", image)
	}
	ref := strings.TrimSuffix(image, image[strings.LastIndex(image, "@"):])
	if strings.HasPrefix(ref, "/") {
		if path.Clean(ref) != ref {
			return fmt.Errorf("image %q: the layout path is not clean", image)
		}
		return nil
	}
	host, repo, ok := strings.Cut(ref, "/")
	if !ok || repo == "" || !hostRE.MatchString(strings.ToLower(host)) ||
		(!strings.ContainsAny(host, ".:") && host != "localhost") {
		return fmt.Errorf("image %q: want a registry reference that names its host (HOST[:PORT]/PATH@sha256:DIGEST) or an absolute OCI layout path", image)
	}
	if strings.ContainsAny(ref, " \t\n") || strings.Contains(ref, "//") {
		return fmt.Errorf("image %q: not a valid reference", image)
	}
	return nil
}

func (l Limits) validate() error {
	cpu, err := quantity("limits.cpu", l.CPU)
	if err != nil {
		return err
	}
	if l.CPU != "" && (cpu < MinCPU || cpu > MaxCPU) {
		return fmt.Errorf("limits.cpu %s is outside %g to %d cores (a weight)", l.CPU, MinCPU, MaxCPU)
	}
	quota, err := quantity("limits.cpuQuota", l.CPUQuota)
	if err != nil {
		return err
	}
	switch {
	case l.CPUQuota != "" && quota < MinCPUQuota:
		return fmt.Errorf("limits.cpuQuota %s is below %g cores", l.CPUQuota, MinCPUQuota)
	case l.CPUQuota != "" && l.CPU != "" && quota < cpu:
		return fmt.Errorf("limits.cpuQuota %s is below limits.cpu %s (the cap must admit the weight)", l.CPUQuota, l.CPU)
	}
	mem, err := quantity("limits.memory", l.Memory)
	if err != nil {
		return err
	}
	if l.Memory != "" && mem < MinMemoryBytes {
		return fmt.Errorf("limits.memory %s is below 128Mi (gVisor's kernel and the server live in it)", l.Memory)
	}
	if l.Pids != 0 && l.Pids < MinPids {
		return fmt.Errorf("limits.pids %d is below %d (a shell and a build need a few tasks each)", l.Pids, MinPids)
	}
	ws, err := quantity("limits.workspace", l.Workspace)
	if err != nil {
		return err
	}
	if l.Workspace != "" && ws < MinWorkspace {
		return fmt.Errorf("limits.workspace %s is below 1Mi", l.Workspace)
	}
	if l.Processes < 0 || l.Processes > MaxProcesses {
		return fmt.Errorf("limits.processes %d is outside 1 to %d", l.Processes, MaxProcesses)
	}
	buf, err := quantity("limits.processBuffer", l.ProcessBuffer)
	if err != nil {
		return err
	}
	if l.ProcessBuffer != "" && (buf < MinProcessBuffer || buf > MaxProcessBuffer) {
		return fmt.Errorf("limits.processBuffer %s is outside 4Ki to 256Mi", l.ProcessBuffer)
	}
	if l.Memory != "" && l.Workspace != "" && ws > mem*7/8 {
		return fmt.Errorf("limits.workspace %s takes more than 7/8 of limits.memory %s: the workspace's files are the sandbox's memory", l.Workspace, l.Memory)
	}
	return nil
}

// ServerArgs returns the fusebox-sandbox flags of the limits its server enforces itself, the
// long-lived processes and their output buffers, for the limits l sets; l must be valid.
func (l Limits) ServerArgs() []string {
	var args []string
	if l.Processes != 0 {
		args = append(args, "-max-processes="+strconv.Itoa(l.Processes))
	}
	if l.ProcessBuffer != "" {
		q := resource.MustParse(l.ProcessBuffer)
		args = append(args, "-process-buffer-bytes="+strconv.FormatInt(q.Value(), 10))
	}
	return args
}

// quantity parses q (empty: 0) as a Kubernetes quantity, refusing a negative one.
func quantity(field, q string) (float64, error) {
	if q == "" {
		return 0, nil
	}
	v, err := resource.ParseQuantity(q)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a quantity (e.g. 500m, 1.5, 512Mi, 2Gi)", field, q)
	}
	if v.Sign() < 0 {
		return 0, fmt.Errorf("%s %s is negative", field, q)
	}
	return v.AsApproximateFloat64(), nil
}

func (p Pool) validate() error {
	switch {
	case p.Min < 0 || p.Max < 0:
		return fmt.Errorf("pool: min %d and max %d must not be negative", p.Min, p.Max)
	case p.Min > MaxPool || p.Max > MaxPool:
		return fmt.Errorf("pool: at most %d ready units", MaxPool)
	case p.Max != 0 && p.Max < p.Min:
		return fmt.Errorf("pool: max %d is below min %d", p.Max, p.Min)
	case p.Estimator != "" && !slices.Contains(Estimators, p.Estimator):
		return fmt.Errorf("pool.estimator %q: want one of %s", p.Estimator, strings.Join(Estimators, ", "))
	}
	return nil
}

// Sizes returns the pool's estimator name, floor and cap with the defaults applied.
func (p Pool) Sizes() (estimator string, min, max int) {
	estimator, min, max = p.Estimator, p.Min, p.Max
	if estimator == "" {
		estimator = "fixed"
	}
	if max < min {
		max = min
	}
	return estimator, min, max
}

// Hash identifies what sandboxes of s are made from: the image, limits, env, working
// directory, user and warm-up, but not the name or the pool's size. Equal specs hash alike
// (map order and a quantity's spelling, 1Gi or 1024Mi, do not count); any change to one of
// those fields changes it. s must be valid.
func (s Spec) Hash() string {
	s.Name, s.Pool = "", Pool{}
	for _, q := range []*string{&s.Limits.CPU, &s.Limits.CPUQuota, &s.Limits.Memory, &s.Limits.Workspace, &s.Limits.ProcessBuffer} {
		if v, err := resource.ParseQuantity(*q); err == nil {
			*q = v.String()
		}
	}
	b, err := json.Marshal(s) // maps marshal in key order
	if err != nil {
		panic(err) // a Spec always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Find returns the template called name in specs.
func Find(specs []Spec, name string) (Spec, bool) {
	i := slices.IndexFunc(specs, func(s Spec) bool { return s.Name == name })
	if i < 0 {
		return Spec{}, false
	}
	return specs[i], true
}
