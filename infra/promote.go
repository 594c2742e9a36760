package infra

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/fusebox-dev/fusebox/components"
)

// Promotion copies the release-defining values of one stack file to another (CI promotion,
// e.g. eks-dev → eks-prod) and leaves every environment-specific value alone.
//
// Release-defining (promoted):
//   - every value under fusebox:images (manager, sandbox, any other image), by digest;
//   - every other fusebox: value whose key ends in "image" (e.g. gvisor.installerImage), by
//     digest;
//   - fusebox:gvisor.version (eks; on aks the installer image carries runsc).
//
// Environment-specific (never touched): everything else — cloud, namespaces, pool sizes, the
// manager's replicas and resources, node pool settings, Cilium, egress, and
// gvisor.binaryBaseURL (where an environment downloads gVisor from, e.g. its in-VPC mirror).

// ErrPromote is wrapped by every error of Promote.
var ErrPromote = errors.New("promotion refused")

// valueKind says how a release-defining value is checked before it is promoted.
type valueKind int

const (
	kindImage   valueKind = iota // repository@sha256:<64 hex>
	kindVersion                  // a gVisor release such as 20250120
)

// releaseKey is a release-defining key of the stack configuration.
type releaseKey struct {
	// path below "config": the configuration key, then field names.
	path []string
	// subtree: every value below path is release-defining.
	subtree bool
	kind    valueKind
	// clouds that use the key; nil means every cloud (cloud-neutral).
	clouds []components.Cloud
}

var releaseKeys = []releaseKey{
	{path: []string{"fusebox:images"}, subtree: true, kind: kindImage},
	{path: []string{"fusebox:gvisor", "installerImage"}, kind: kindImage, clouds: []components.Cloud{components.EKS, components.AKS}},
	{path: []string{"fusebox:gvisor", "version"}, kind: kindVersion, clouds: []components.Cloud{components.EKS}},
}

// classify returns the release key that path falls under, or false for an
// environment-specific value.
func classify(path []string) (releaseKey, bool) {
	for _, k := range releaseKeys {
		if len(path) < len(k.path) || !slices.Equal(path[:len(k.path)], k.path) {
			continue
		}
		if len(path) == len(k.path) || k.subtree {
			return k, true
		}
	}
	// Any other image of the installation (a key ending in "image"), wherever it is.
	last := path[len(path)-1]
	if strings.HasPrefix(path[0], Namespace+":") && strings.HasSuffix(strings.ToLower(last), "image") {
		return releaseKey{path: path, kind: kindImage}, true
	}
	return releaseKey{}, false
}

// usedOn reports whether cloud uses the key.
func (k releaseKey) usedOn(cloud components.Cloud) bool {
	return k.clouds == nil || slices.Contains(k.clouds, cloud)
}

// check validates a value of the key's kind.
func (k releaseKey) check(v string) error {
	switch k.kind {
	case kindImage:
		return components.ValidateImage(v)
	case kindVersion:
		if !gvisorVersion.MatchString(v) {
			return fmt.Errorf("%q is not a pinned gVisor release such as \"20250120\"", v)
		}
	}
	return nil
}

// Change is one promoted value.
type Change struct {
	// Key is the configuration key, e.g. "fusebox:images.manager".
	Key      string
	Old, New string
}

// PromoteOptions configure Promote.
type PromoteOptions struct {
	// StacksDir holds the Pulumi.<stack>.yaml files. Required.
	StacksDir string
	// From and To are stack names. Required, and different.
	From, To string
	// DryRun computes the changes and writes nothing.
	DryRun bool
	// Verify, when set, is called with each image reference the target gets, before anything
	// is written; an error refuses the promotion (e.g. the digest is not in the target's
	// registry).
	Verify func(ref string) error
}

// Promote copies the release-defining values of stack From into stack To's file, editing it
// as a YAML node tree so that its comments, order and every other value stay as they are. It
// refuses, naming the key and the file, when a source value is not pinned (an image without a
// digest, an unpinned gVisor release, a malformed checksum), when a key of the source is
// missing in the target (or the reverse), and when the stacks' clouds differ and a key is not
// used on both. It returns the changes in file order; with DryRun, or without changes, it
// writes nothing.
func Promote(o PromoteOptions) ([]Change, error) {
	if o.StacksDir == "" || o.From == "" || o.To == "" {
		return nil, fmt.Errorf("%w: the stacks directory and both stacks are required", ErrPromote)
	}
	if o.From == o.To {
		return nil, fmt.Errorf("%w: --from and --to are both %q", ErrPromote, o.From)
	}
	srcFile := filepath.Join(o.StacksDir, "Pulumi."+o.From+".yaml")
	dstFile := filepath.Join(o.StacksDir, "Pulumi."+o.To+".yaml")
	src, err := os.ReadFile(srcFile)
	if err != nil {
		return nil, fmt.Errorf("%w: reading stack %s: %w", ErrPromote, o.From, err)
	}
	dst, err := os.ReadFile(dstFile)
	if err != nil {
		return nil, fmt.Errorf("%w: reading stack %s: %w", ErrPromote, o.To, err)
	}
	out, changes, err := PromoteStackFiles(src, dst, displayPath(srcFile), displayPath(dstFile))
	if err != nil {
		return nil, err
	}
	if o.Verify != nil {
		// Every image the target pulls after the promotion, changed or not.
		f, err := parseStack(out, displayPath(dstFile))
		if err != nil {
			return nil, err
		}
		for _, l := range f.release {
			if l.key.kind != kindImage {
				continue
			}
			if err := o.Verify(l.node.Value); err != nil {
				return nil, fmt.Errorf("%w: %s for %s: %w (nothing written)", ErrPromote, l.name(), displayPath(dstFile), err)
			}
		}
	}
	if o.DryRun || len(changes) == 0 {
		return changes, nil
	}
	if err := writeFileAtomic(dstFile, out); err != nil {
		return nil, fmt.Errorf("%w: writing %s: %w", ErrPromote, dstFile, err)
	}
	return changes, nil
}

// displayPath names a stack file as stacks/Pulumi.<stack>.yaml, the way configuration
// errors do.
func displayPath(p string) string {
	return filepath.Join(filepath.Base(filepath.Dir(p)), filepath.Base(p))
}

// leaf is a scalar value of the configuration and its path.
type leaf struct {
	path []string
	node *yaml.Node
	key  releaseKey
}

func (l leaf) name() string {
	return l.path[0] + "." + strings.Join(l.path[1:], ".")
}

// stackFile is a parsed stack file.
type stackFile struct {
	name  string // for messages
	doc   yaml.Node
	cloud components.Cloud
	// registry is the stack's fusebox:registry ("" when it has none).
	registry string
	// release are the release-defining values, in file order.
	release []leaf
}

func parseStack(b []byte, name string) (*stackFile, error) {
	f := &stackFile{name: name}
	if err := yaml.Unmarshal(b, &f.doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrPromote, name, err)
	}
	if len(f.doc.Content) != 1 || f.doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: %s is not a YAML mapping", ErrPromote, name)
	}
	cfg := mapValue(f.doc.Content[0], "config")
	if cfg == nil || cfg.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: %s has no config mapping", ErrPromote, name)
	}
	cloud := mapValue(cfg, Namespace+":cloud")
	if cloud == nil || cloud.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("%w: %s:cloud in %s: required", ErrPromote, Namespace, name)
	}
	c, err := components.ParseCloud(cloud.Value)
	if err != nil {
		return nil, fmt.Errorf("%w: %s:cloud in %s: %v", ErrPromote, Namespace, name, err)
	}
	f.cloud = c
	if r := mapValue(cfg, RegistryKey); r != nil && r.Kind == yaml.ScalarNode {
		f.registry = strings.TrimSuffix(r.Value, "/")
	}
	var walk func(n *yaml.Node, path []string)
	walk = func(n *yaml.Node, path []string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], append(slices.Clip(path), n.Content[i].Value))
			}
		case yaml.ScalarNode:
			if k, ok := classify(path); ok {
				f.release = append(f.release, leaf{path: path, node: n, key: k})
			}
		}
		// Sequences (node pool requirements, egress lists) hold no release-defining values.
	}
	walk(cfg, nil)
	return f, nil
}

// mapValue returns the value of key in mapping m, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func (f *stackFile) find(path []string) *leaf {
	for i := range f.release {
		if slices.Equal(f.release[i].path, path) {
			return &f.release[i]
		}
	}
	return nil
}

// retarget returns the value image leaf l of the source gets in the target: its digest, under
// the target's registry (fusebox:registry), else in the repository of the target's value t.
func (d *stackFile) retarget(l leaf, t *leaf) (string, error) {
	repo, digest, _ := strings.Cut(l.node.Value, "@")
	switch {
	case d.registry != "":
		return d.registry + "/" + repo[strings.LastIndex(repo, "/")+1:] + "@" + digest, nil
	case t != nil:
		trepo, _, _ := strings.Cut(t.node.Value, "@")
		if trepo == "" {
			break
		}
		return trepo + "@" + digest, nil
	}
	return "", fmt.Errorf("%w: %s cannot go to %s: it has no %s (the registry that stack pulls from) and no image of its own to keep the repository of: set %s there, or release into it with fusebox release --registry HOST[:PORT]/PATH --stack %s",
		ErrPromote, l.name(), d.name, RegistryKey, RegistryKey, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(d.name), "Pulumi."), ".yaml"))
}

// addLeaf adds the scalar at path (below config) to the target, creating mappings on the
// way, and returns it.
func addLeaf(d *stackFile, path []string) *yaml.Node {
	m := mapValue(d.doc.Content[0], "config")
	for i, k := range path {
		if i == len(path)-1 {
			setScalar(m, k, "", "")
			return mapValue(m, k)
		}
		after := ""
		if i == 0 {
			after = RegistryKey
		}
		m = ensureMapping(m, k, after)
	}
	return nil
}

// PromoteStackFiles is Promote on the files' contents: it returns the target file with the
// source's release-defining values, and the changes. srcName and dstName name the files in
// messages.
func PromoteStackFiles(src, dst []byte, srcName, dstName string) ([]byte, []Change, error) {
	s, err := parseStack(src, srcName)
	if err != nil {
		return nil, nil, err
	}
	d, err := parseStack(dst, dstName)
	if err != nil {
		return nil, nil, err
	}
	var changes []Change
	for _, l := range s.release {
		if err := l.key.check(l.node.Value); err != nil {
			return nil, nil, fmt.Errorf("%w: %s in %s: %v", ErrPromote, l.name(), srcName, err)
		}
		if s.cloud != d.cloud && !(l.key.usedOn(s.cloud) && l.key.usedOn(d.cloud)) {
			return nil, nil, fmt.Errorf("%w: %s in %s is specific to %s, and the stacks are of different clouds (%s → %s in %s)",
				ErrPromote, l.name(), srcName, cloudList(l.key.clouds), s.cloud, d.cloud, dstName)
		}
		t := d.find(l.path)
		want := l.node.Value
		if l.key.kind == kindImage {
			// Images carry their digest and keep the target's registry: its own
			// fusebox:registry, else the repository its value names.
			var err error
			if want, err = d.retarget(l, t); err != nil {
				return nil, nil, err
			}
			if t == nil {
				// A stack without a release yet: the key is added under the target's registry.
				n := addLeaf(d, l.path)
				if n == nil {
					return nil, nil, fmt.Errorf("%w: %s is in %s but cannot be added to %s", ErrPromote, l.name(), srcName, dstName)
				}
				t = &leaf{path: l.path, node: n, key: l.key}
			}
		} else if t == nil {
			return nil, nil, fmt.Errorf("%w: %s is in %s but missing in %s: add it to the target first (promotion only replaces values)",
				ErrPromote, l.name(), srcName, dstName)
		}
		if t.node.Value != want {
			changes = append(changes, Change{Key: l.name(), Old: t.node.Value, New: want})
			// The target keeps its comments; value, tag and quoting come from the source.
			t.node.Value, t.node.Tag, t.node.Style = want, l.node.Tag, l.node.Style
		}
	}
	// A release value of the target that the source lacks would stay at the old release.
	for _, t := range d.release {
		if s.find(t.path) == nil && t.key.usedOn(s.cloud) {
			return nil, nil, fmt.Errorf("%w: %s is in %s but missing in %s: it would be left at the old release",
				ErrPromote, t.name(), dstName, srcName)
		}
	}
	if len(changes) == 0 {
		return dst, nil, nil
	}
	out, err := encodeStack(&d.doc, dstName)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrPromote, err)
	}
	return out, changes, nil
}

// encodeStack writes a stack file's node tree back, indented as the files are.
func encodeStack(doc *yaml.Node, name string) ([]byte, error) {
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding %s: %v", name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encoding %s: %v", name, err)
	}
	return out.Bytes(), nil
}

func cloudList(cs []components.Cloud) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, " and ")
}

// writeFileAtomic replaces path with b through a temporary file in the same directory,
// keeping path's permissions.
func writeFileAtomic(path string, b []byte) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".promote-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is nothing to remove
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
