package customresource

import (
	"testing"

	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

type spec struct {
	Name   string            `json:"name"`
	Empty  string            `json:"empty,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Rules  []struct{}        `json:"rules"`
	Count  int               `json:"count"`
}

func TestArgs(t *testing.T) {
	a, err := Args("example.com/v1", "Thing", metav1.ObjectMetaArgs{Name: pulumi.String("x")},
		spec{Name: "n", Rules: []struct{}{{}}, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	m, ok := a.OtherFields["spec"].(map[string]any)
	if !ok {
		t.Fatalf("spec is %T", a.OtherFields["spec"])
	}
	if m["name"] != "n" || m["count"] != 3.0 {
		t.Errorf("spec %v", m)
	}
	if _, ok := m["empty"]; ok {
		t.Errorf("omitempty field present: %v", m)
	}
	if r, _ := m["rules"].([]any); len(r) != 1 {
		t.Errorf("rules %v", m["rules"])
	} else if e, _ := r[0].(map[string]any); e == nil || len(e) != 0 {
		t.Errorf("empty rule %v, want {}", r[0])
	}
}

func TestArgsRefusesNonObjects(t *testing.T) {
	if _, err := Args("example.com/v1", "Thing", metav1.ObjectMetaArgs{}, []string{"x"}); err == nil {
		t.Fatal("a list spec was accepted")
	}
}
