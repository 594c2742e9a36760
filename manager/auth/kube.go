package auth

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeTokenReviewer reviews tokens with the Kubernetes API's TokenReview (the manager's
// ServiceAccount needs "create" on tokenreviews.authentication.k8s.io, a cluster-wide
// permission).
func KubeTokenReviewer(cs kubernetes.Interface) TokenReviewer {
	return func(ctx context.Context, token string, audiences []string) (Review, error) {
		tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
		}, metav1.CreateOptions{})
		if err != nil {
			return Review{}, err
		}
		return Review{Authenticated: tr.Status.Authenticated, Username: tr.Status.User.Username,
			Audiences: tr.Status.Audiences, Error: tr.Status.Error}, nil
	}
}
