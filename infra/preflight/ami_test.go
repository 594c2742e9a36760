package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeSSM serves SSM's GetParameter on loopback as the AWS JSON 1.1 protocol has it (POST /,
// X-Amz-Target AmazonSSM.GetParameter, {"Name": ...}; a missing parameter is a 400 with
// __type ParameterNotFound), and records the names asked for. Requests must be signed with
// SigV4 for the ssm service.
type fakeSSM struct {
	params map[string]string
	mu     sync.Mutex // guards asked
	asked  []string
}

func (f *fakeSSM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	if r.Method != http.MethodPost || r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter" {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"__type":"InvalidAction","message":"not GetParameter"}`)
		return
	}
	if a := r.Header.Get("Authorization"); !strings.HasPrefix(a, "AWS4-HMAC-SHA256 Credential=AKIDTEST/") || !strings.Contains(a, "/ssm/aws4_request") {
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"__type":"UnrecognizedClientException","message":"unsigned"}`)
		return
	}
	var in struct{ Name string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.asked = append(f.asked, in.Name)
	f.mu.Unlock()
	v, ok := f.params[in.Name]
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"__type":"ParameterNotFound","message":""}`)
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"Parameter": map[string]any{"Name": in.Name, "Type": "String", "Value": v, "Version": 1}})
}

// awsEnv points the AWS SDK's default configuration at nothing but what the test sets: no
// shared files, no IMDS (no traffic to the instance metadata address), no profile.
func awsEnv(t *testing.T) {
	t.Helper()
	none := filepath.Join(t.TempDir(), "none")
	for k, v := range map[string]string{
		"AWS_CONFIG_FILE": none, "AWS_SHARED_CREDENTIALS_FILE": none, "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_PROFILE": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_ROLE_ARN": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": "",
		"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_SSM": "",
	} {
		t.Setenv(k, v)
	}
}

func clusterVersion(v string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) { return v, nil }
}

// The parameter Karpenter reads for al2023@v20251112 on a 1.34 cluster
// (karpenter-provider-aws pkg/providers/amifamily/al2023.go, resolvePath).
const x86Param = "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/amazon-eks-node-al2023-x86_64-standard-1.34-v20251112/image_id"

func TestAL2023ImageParameter(t *testing.T) {
	if got := AL2023ImageParameter("1.34", "x86_64", "v20251112"); got != x86Param {
		t.Errorf("got %s", got)
	}
}

// TestCheckAMI resolves the alias through the AWS SDK's default configuration (credentials,
// region and the SSM endpoint from the environment) against a fake SSM on loopback.
func TestCheckAMI(t *testing.T) {
	fake := &fakeSSM{params: map[string]string{
		x86Param: "ami-0123456789abcdef0",
		"/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/arm64/standard/amazon-eks-node-al2023-arm64-standard-1.34-v20251112/image_id": "ami-0fedcba9876543210",
	}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	awsEnv(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_REGION", "us-west-2")
	t.Setenv("AWS_ENDPOINT_URL_SSM", srv.URL)
	ctx := context.Background()

	for _, tc := range []struct {
		name      string
		stack     AMIStack
		version   string
		wantOut   string
		wantErr   []string // in the refusal
		wantAsked int
	}{
		{"resolves, amd64 only", AMIStack{Name: "eks-dev", Alias: "al2023@v20251112", Architectures: []string{"amd64"}}, "v1.34.2-eks-113cf36",
			`resolves to x86_64 ami-0123456789abcdef0`, nil, 1},
		{"resolves, any architecture", AMIStack{Name: "eks-dev", Alias: "al2023@v20251112"}, "v1.34.0",
			`resolves to arm64 ami-0fedcba9876543210, x86_64 ami-0123456789abcdef0`, nil, 2},
		{"no such release", AMIStack{Name: "eks-prod", Alias: "al2023@v20251110", Architectures: []string{"amd64"}}, "v1.34.2",
			"", []string{"fusebox:nodePool.ec2.amiAlias", `"al2023@v20251110"`, "stacks/Pulumi.eks-prod.yaml", "does not resolve",
				"/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/amazon-eks-node-al2023-x86_64-standard-1.34-v20251110/image_id"}, 1},
		{"release not built for the cluster's version", AMIStack{Name: "eks-dev", Alias: "al2023@v20251112"}, "v1.35.0",
			"", []string{"fusebox:nodePool.ec2.amiAlias", "for Kubernetes 1.35"}, 2},
		{"amiID instead", AMIStack{Name: "eks-dev"}, "v1.34.0", "", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.asked = nil
			fake.mu.Unlock()
			var out bytes.Buffer
			err := CheckAMI(ctx, tc.stack, clusterVersion(tc.version), nil, &out)
			if tc.wantErr == nil && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("want a refusal, got %v", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal lacks %q:\n%v", w, err)
					}
				}
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("output %q lacks %q", out.String(), tc.wantOut)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if len(fake.asked) != tc.wantAsked {
				t.Errorf("asked SSM for %v, want %d parameters", fake.asked, tc.wantAsked)
			}
		})
	}
}

// TestCheckAMINoCredentials: without AWS credentials the check says it was skipped and does
// not fail; with no region, the same.
func TestCheckAMINoCredentials(t *testing.T) {
	for name, region := range map[string]string{"no credentials": "us-west-2", "no region": ""} {
		t.Run(name, func(t *testing.T) {
			awsEnv(t)
			t.Setenv("AWS_REGION", region)
			var out bytes.Buffer
			asked := false
			version := func(context.Context) (string, error) { asked = true; return "v1.34.0", nil }
			if err := CheckAMI(context.Background(), AMIStack{Name: "eks-dev", Alias: "al2023@v20251110"}, version, nil, &out); err != nil {
				t.Fatalf("want no error without credentials, got %v", err)
			}
			if !strings.Contains(out.String(), "preflight: skipped resolving fusebox:nodePool.ec2.amiAlias \"al2023@v20251110\"") {
				t.Errorf("output %q does not say the check was skipped", out.String())
			}
			if asked {
				t.Error("read the cluster's version for a skipped check")
			}
		})
	}
}

// TestCheckAMISSMError: a failing SSM (not a missing parameter) is an error, not a refusal.
func TestCheckAMISSMError(t *testing.T) {
	get := func(context.Context, string) (string, error) { return "", errors.New("throttled") }
	_, err := CheckAMIAlias(context.Background(), AMIStack{Name: "eks-dev", Alias: "al2023@v20251112"}, "v1.34.0", get)
	if err == nil || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "throttled") {
		t.Fatalf("got %v", err)
	}
}
