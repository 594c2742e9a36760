package infra

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestAMIPreflight: the EKS stacks hand preflight's AMI check their pinned alias and the node
// pool's architectures; other clouds have nothing to resolve.
func TestAMIPreflight(t *testing.T) {
	for _, tc := range []struct {
		stack, alias string
		archs        []string
	}{
		{"eks-dev", "al2023@v20251112", []string{"amd64"}},
		{"eks-prod", "al2023@v20251112", []string{"amd64"}},
		{"gke-dev", "", nil},
		{"aks-dev", "", nil},
		{"local", "", nil},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			c, err := LoadStackFile(releasedCopy(t, filepath.Join("..", "stacks", "Pulumi."+tc.stack+".yaml")), tc.stack)
			if err != nil {
				t.Fatal(err)
			}
			a := c.AMIPreflight(tc.stack)
			if a.Name != tc.stack || a.Alias != tc.alias || !slices.Equal(a.Architectures, tc.archs) {
				t.Errorf("got %+v, want alias %q, architectures %v", a, tc.alias, tc.archs)
			}
		})
	}
}
