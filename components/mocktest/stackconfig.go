package mocktest

import (
	"encoding/json"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// StackConfig reads a Pulumi stack file (Pulumi.<stack>.yaml) and returns its config the way
// the Pulumi engine hands configuration to a Go program, for WithConfig: strings as they are,
// other scalars printed, structured values as JSON. Unknown top-level keys are an error.
func StackConfig(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Config map[string]any `json:"config"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string]string, len(f.Config))
	for k, v := range f.Config {
		switch v := v.(type) {
		case string:
			out[k] = v
		case bool, float64:
			out[k] = fmt.Sprint(v)
		default:
			j, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, k, err)
			}
			out[k] = string(j)
		}
	}
	return out, nil
}
