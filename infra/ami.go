package infra

import (
	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/infra/preflight"
)

// AMIPreflight is what preflight's AMI check (preflight.CheckAMI) needs of an EKS stack: the
// pinned alias and the architectures the node pool allows (its kubernetes.io/arch "In"
// requirement). Other clouds, and an EKS stack pinned by amiID, have no alias to check.
func (c *Config) AMIPreflight(stack string) preflight.AMIStack {
	s := preflight.AMIStack{Name: stack}
	if c.Cloud != components.EKS || c.NodePool.EC2 == nil {
		return s
	}
	s.Alias = c.NodePool.EC2.AMIAlias
	for _, r := range c.NodePool.Requirements {
		if r.Key == "kubernetes.io/arch" && r.Operator == "In" {
			s.Architectures = append(s.Architectures, r.Values...)
		}
	}
	return s
}
