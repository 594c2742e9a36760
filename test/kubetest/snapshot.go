package kubetest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Snapshot names every object the API server holds, as "resource.group/namespace/name", for
// every listable resource in its preferred version; events are left out (the control plane
// writes them on its own). Tests compare two with Diff to find what a deployment created
// or left behind.
func (e *Env) Snapshot(ctx context.Context) (map[string]bool, error) {
	// Listing every resource warns about the deprecated ones (Endpoints, ComponentStatus).
	cfg := rest.CopyConfig(e.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	out := map[string]bool{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || r.Name == "events" {
				continue
			}
			gvr := gv.WithResource(r.Name)
			items, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("listing %s: %w", gvr, err)
			}
			key := gvr.GroupResource().String()
			for _, it := range items.Items {
				out[fmt.Sprintf("%s/%s/%s", key, it.GetNamespace(), it.GetName())] = true
			}
		}
	}
	return out, nil
}

// Diff returns the keys of a that b lacks, sorted.
func Diff(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
