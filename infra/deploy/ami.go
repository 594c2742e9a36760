package deploy

import (
	"context"
	"io"
	"os"

	"k8s.io/client-go/kubernetes"
)

// serverVersion reads the cluster's Kubernetes version (its git version, "v1.34.2-eks-..."),
// which the AMI check resolves the node image alias for, as Karpenter does.
func serverVersion(cs kubernetes.Interface) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		v, err := cs.Discovery().ServerVersion()
		if err != nil {
			return "", err
		}
		return v.GitVersion, nil
	}
}

// progress is where preflight's notes go: Progress, else standard error.
func (o Options) progress() io.Writer {
	if o.Progress != nil {
		return o.Progress
	}
	return os.Stderr
}
