// Package customresource turns a typed Go spec of a CRD object (Karpenter, Cilium) into the
// untyped arguments of apiextensions.CustomResource. It is the one place where typed structs
// become maps: components build typed specs and convert them only here, at the boundary.
package customresource

import (
	"encoding/json"
	"fmt"

	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apiextensions"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Args returns CustomResource arguments for apiVersion/kind with metadata and the JSON form of
// spec (a struct with json tags) as its "spec" field.
func Args(apiVersion, kind string, meta metav1.ObjectMetaArgs, spec any) (*apiextensions.CustomResourceArgs, error) {
	m, err := ToMap(spec)
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s spec: %w", apiVersion, kind, err)
	}
	return &apiextensions.CustomResourceArgs{
		ApiVersion:  pulumi.String(apiVersion),
		Kind:        pulumi.String(kind),
		Metadata:    meta,
		OtherFields: kubernetes.UntypedArgs{"spec": m},
	}, nil
}

// ToMap converts a struct with json tags into the plain map form Pulumi serialises.
func ToMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}
