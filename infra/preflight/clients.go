package preflight

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// FromClients reads the cluster through cs (its discovery client for Served).
func FromClients(cs kubernetes.Interface) Cluster {
	notFound := func(err error) error {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		return err
	}
	return Cluster{
		ServerVersion: func(context.Context) (string, error) {
			v, err := cs.Discovery().ServerVersion()
			if err != nil {
				return "", err
			}
			return v.GitVersion, nil
		},
		ConfigMap: func(ctx context.Context, ns, name string) (map[string]string, error) {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, notFound(err)
			}
			return cm.Data, nil
		},
		RuntimeClass: func(ctx context.Context, name string) (string, error) {
			rc, err := cs.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", notFound(err)
			}
			return rc.Handler, nil
		},
		Served: func(_ context.Context, group, version, resource string) (bool, error) {
			list, err := cs.Discovery().ServerResourcesForGroupVersion(group + "/" + version)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			for _, r := range list.APIResources {
				if r.Name == resource {
					return true, nil
				}
			}
			return false, nil
		},
		Namespace: func(ctx context.Context, name string) (bool, error) {
			_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		},
		SecretType: func(ctx context.Context, ns, name string) (string, error) {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", notFound(err)
			}
			return string(s.Type), nil
		},
		Nodes: func(ctx context.Context, selector string) ([]Node, error) {
			var out []Node
			opts := metav1.ListOptions{LabelSelector: selector, Limit: 500}
			for {
				list, err := cs.CoreV1().Nodes().List(ctx, opts)
				if err != nil {
					return nil, err
				}
				for i := range list.Items {
					out = append(out, node(&list.Items[i]))
				}
				if opts.Continue = list.Continue; opts.Continue == "" {
					return out, nil
				}
			}
		},
		DaemonSet: func(ctx context.Context, ns, name string) (DaemonSet, error) {
			ds, err := cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return DaemonSet{}, notFound(err)
			}
			spec := ds.Spec.Template.Spec
			out := DaemonSet{HostNetwork: spec.HostNetwork}
			for _, c := range spec.Containers {
				out.Images = append(out.Images, c.Image)
				out.Args = append(append(out.Args, c.Command...), c.Args...)
			}
			return out, nil
		},
	}
}

// node is what the checks read of n.
func node(n *corev1.Node) Node {
	out := Node{Name: n.Name, Unschedulable: n.Spec.Unschedulable}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Ready = c.Status == corev1.ConditionTrue
		}
	}
	for _, t := range n.Spec.Taints {
		out.Taints = append(out.Taints, Taint(t.Key, t.Value, string(t.Effect)))
	}
	return out
}
