package preflight

import (
	"context"
	"fmt"

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
	}
}
