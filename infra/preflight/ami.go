package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
)

// AMIAliasKey is the stack key of the EKS node image's alias, named in the AMI check's
// refusals.
const AMIAliasKey = "fusebox:nodePool.ec2.amiAlias"

// AMIStack is what the AMI check needs of an EKS stack.
type AMIStack struct {
	Name string // for messages: stacks/Pulumi.<Name>.yaml
	// Alias is the pinned AL2023 release, "al2023@vYYYYMMDD" (empty with an amiID: nothing
	// to resolve).
	Alias string
	// Architectures are the node pool's kubernetes.io/arch values (amd64, arm64); empty
	// allows both.
	Architectures []string
}

// Parameter returns the value of the SSM parameter name, and an error wrapping ErrNotFound
// when there is no such parameter.
type Parameter func(ctx context.Context, name string) (string, error)

// ErrNoAWSCredentials is returned by SSMParameter when the AWS SDK's default chain finds no
// credentials: the AMI check is then skipped, not failed.
var ErrNoAWSCredentials = errors.New("no AWS credentials")

var aliasVersion = regexp.MustCompile(`^al2023@(v[0-9]{8})$`)

// AL2023ImageParameter is the public SSM parameter that holds the AMI ID of an AL2023 EKS
// release: the one Karpenter reads for the alias al2023@<version>
// (karpenter-provider-aws pkg/providers/amifamily/al2023.go, AL2023.resolvePath):
// /aws/service/eks/optimized-ami/<k8s>/amazon-linux-2023/<arch>/<variant>/
// amazon-eks-node-al2023-<arch>-<variant>-<k8s>-<version>/image_id, arch x86_64 or arm64.
// Sandbox nodes use the standard variant.
func AL2023ImageParameter(kubernetesVersion, arch, version string) string {
	name := fmt.Sprintf("amazon-eks-node-al2023-%s-standard-%s-%s", arch, kubernetesVersion, version)
	return fmt.Sprintf("/aws/service/eks/optimized-ami/%s/amazon-linux-2023/%s/standard/%s/image_id", kubernetesVersion, arch, name)
}

var minorVersion = regexp.MustCompile(`^v?([0-9]+)\.([0-9]+)`)

// CheckAMIAlias resolves s's AMI alias through get as Karpenter does for the cluster's
// Kubernetes version (its git version, "v1.34.2-eks-..."), and refuses, naming the stack key,
// an alias with no AMI for any of the node pool's architectures: Karpenter would launch no
// node ("failed to discover any AMIs for alias"). It returns the AMI IDs it found, by
// architecture.
func CheckAMIAlias(ctx context.Context, s AMIStack, kubernetesVersion string, get Parameter) (map[string]string, error) {
	if s.Alias == "" {
		return nil, nil
	}
	file := "stacks/Pulumi." + s.Name + ".yaml"
	m := aliasVersion.FindStringSubmatch(s.Alias)
	if m == nil {
		return nil, fmt.Errorf("%w (nothing was changed):\n  - %s %q in %s: want al2023@vYYYYMMDD", ErrRefused, AMIAliasKey, s.Alias, file)
	}
	kv := minorVersion.FindStringSubmatch(kubernetesVersion)
	if kv == nil {
		return nil, fmt.Errorf("resolving %s: the cluster's Kubernetes version %q is not MAJOR.MINOR", AMIAliasKey, kubernetesVersion)
	}
	k8s := kv[1] + "." + kv[2]
	var archs []string
	for _, a := range []struct{ node, ami string }{{"amd64", "x86_64"}, {"arm64", "arm64"}} {
		if len(s.Architectures) == 0 || slices.Contains(s.Architectures, a.node) {
			archs = append(archs, a.ami)
		}
	}
	found := map[string]string{}
	var tried []string
	for _, arch := range archs {
		p := AL2023ImageParameter(k8s, arch, m[1])
		id, err := get(ctx, p)
		switch {
		case errors.Is(err, ErrNotFound):
			tried = append(tried, p)
		case err != nil:
			return nil, fmt.Errorf("resolving %s %q (SSM parameter %s): %w", AMIAliasKey, s.Alias, p, err)
		default:
			found[arch] = id
		}
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("%w (nothing was changed):\n  - %s %q in %s does not resolve: no AL2023 release %s for Kubernetes %s (SSM parameters not found: %s), so Karpenter would launch no node. Pin a release that exists for this cluster (the amazon-eks-ami releases), or set amiID",
			ErrRefused, AMIAliasKey, s.Alias, file, m[1], k8s, strings.Join(tried, ", "))
	}
	return found, nil
}

// SSMParameter reads SSM parameters with the AWS SDK's default configuration (environment,
// shared files, IMDS on EC2); opts adjust it (tests point the endpoint at a local server). It
// returns ErrNoAWSCredentials when no credentials or no region are found, so that the caller
// skips the check.
func SSMParameter(ctx context.Context, opts ...func(*awsconfig.LoadOptions) error) (Parameter, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("%w: no AWS region (set AWS_REGION to the cluster's)", ErrNoAWSCredentials)
	}
	if cfg.Credentials == nil {
		return nil, ErrNoAWSCredentials
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoAWSCredentials, err)
	}
	client := ssm.NewFromConfig(cfg)
	return func(ctx context.Context, name string) (string, error) {
		out, err := client.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name)})
		var nf *ssmtypes.ParameterNotFound
		if errors.As(err, &nf) {
			return "", fmt.Errorf("%w: SSM parameter %s", ErrNotFound, name)
		}
		if err != nil {
			return "", err
		}
		if out.Parameter == nil || aws.ToString(out.Parameter.Value) == "" {
			return "", fmt.Errorf("SSM parameter %s has no value", name)
		}
		return aws.ToString(out.Parameter.Value), nil
	}, nil
}

// CheckAMI checks s's AMI alias (CheckAMIAlias) against the cluster's Kubernetes version
// (version) through get, or through SSMParameter's default AWS configuration when get is nil.
// Without AWS credentials it writes to w that it skipped the check and returns nil: the
// alias is then first resolved by Karpenter, whose EC2NodeClass status says when it fails.
func CheckAMI(ctx context.Context, s AMIStack, version func(context.Context) (string, error), get Parameter, w io.Writer) error {
	if s.Alias == "" {
		return nil
	}
	if get == nil {
		p, err := SSMParameter(ctx)
		if errors.Is(err, ErrNoAWSCredentials) {
			fmt.Fprintf(w, "preflight: skipped resolving %s %q through SSM (%v): Karpenter resolves it when it launches a node; `kubectl get ec2nodeclass` shows whether it did\n", AMIAliasKey, s.Alias, err)
			return nil
		}
		if err != nil {
			return err
		}
		get = p
	}
	v, err := version(ctx)
	if err != nil {
		return fmt.Errorf("reading the cluster's Kubernetes version: %w", err)
	}
	ids, err := CheckAMIAlias(ctx, s, v, get)
	if err != nil {
		return err
	}
	archs := make([]string, 0, len(ids))
	for a := range ids {
		archs = append(archs, a+" "+ids[a])
	}
	slices.Sort(archs)
	fmt.Fprintf(w, "preflight: %s %q resolves to %s\n", AMIAliasKey, s.Alias, strings.Join(archs, ", "))
	return nil
}
