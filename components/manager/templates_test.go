package manager

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
)

func pyTemplate() templates.Spec {
	return templates.Spec{Name: "py", Image: "registry.example.com/team/py@sha256:" + digest, User: "app",
		Env: map[string]string{"PIP_NO_INDEX": "1"}, Limits: templates.Limits{Memory: "1Gi"},
		Pool: templates.Pool{Min: 1, Max: 3}}
}

// TestTemplatesReachTheManager: the stack's templates are a key of the sandbox template's
// ConfigMap, which the manager reads with --templates (and which, as every key of it, rolls the
// manager when it changes); the file is the manager's own format, read back by its parser.
func TestTemplatesReachTheManager(t *testing.T) {
	a := args()
	a.Templates = []templates.Spec{pyTemplate()}
	m, _ := run(t, a)
	argv := strs(mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0, "args"))
	if !slices.Contains(argv, "--templates="+TemplatesPath) {
		t.Errorf("args %v, want --templates=%s", argv, TemplatesPath)
	}
	ann, data := podAnnotations(t, a)
	file := data[TemplateCMName][TemplatesKey]
	specs, err := templates.Parse([]byte(file))
	if err != nil || len(specs) != 1 || specs[0].Hash() != pyTemplate().Hash() || specs[0].Pool != pyTemplate().Pool {
		t.Fatalf("the templates file reads back as %+v, %v:\n%s", specs, err, file)
	}
	without, dataWithout := podAnnotations(t, args())
	if _, ok := dataWithout[TemplateCMName][TemplatesKey]; ok {
		t.Error("a stack without templates renders a templates file")
	}
	if ann[ChecksumAnnotation(TemplateCMName)] == without[ChecksumAnnotation(TemplateCMName)] {
		t.Error("the templates do not change the ConfigMap's checksum: the manager would not roll")
	}
	m, _ = run(t, args())
	for _, arg := range strs(mocktest.Dig(m.One(t, deployType).Props(), "spec", "template", "spec", "containers", 0, "args")) {
		if strings.HasPrefix(arg, "--templates") {
			t.Errorf("a stack without templates passes %s", arg)
		}
	}
}

// TestRefusesBadTemplates: what the manager would refuse at its start, up refuses before it
// registers anything, naming the template.
func TestRefusesBadTemplates(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*templates.Spec)
		want error
	}{
		"tag":                   {func(s *templates.Spec) { s.Image = "registry.example.com/team/py:latest" }, templates.ErrInvalid},
		"pids":                  {func(s *templates.Spec) { s.Limits.Pids = 64 }, kubealloc.ErrTemplateSpec},
		"layout":                {func(s *templates.Spec) { s.Image = "/srv/layouts/py@sha256:" + digest }, kubealloc.ErrTemplateSpec},
		"workspace over memory": {func(s *templates.Spec) { s.Limits.Memory, s.Limits.Workspace = "", "4Gi" }, kubealloc.ErrTemplateSpec},
	} {
		t.Run(name, func(t *testing.T) {
			spec := pyTemplate()
			tc.mut(&spec)
			a := args()
			a.Templates = []templates.Spec{spec}
			m, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewManager(ctx, "fb", a)
				return err
			})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "py") {
				t.Fatalf("want %v naming the template, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered before refusing", n)
			}
		})
	}
}
