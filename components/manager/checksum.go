package manager

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// ChecksumAnnotationPrefix starts the manager pod template's annotations that carry, for each
// ConfigMap the manager reads, the SHA-256 of its data (ChecksumAnnotation). The manager reads
// the sandbox template, the templates file and the authorisation policy once, at start: a change of either alone
// would leave the Deployment's pods as they are and the manager on the old values, so the
// checksum changes the pod template and Kubernetes rolls the replicas onto the new data.
const ChecksumAnnotationPrefix = "checksum.fusebox.dev/"

// ChecksumAnnotation is the pod template annotation of ConfigMap name's checksum.
func ChecksumAnnotation(name string) string { return ChecksumAnnotationPrefix + name }

// templateData and policyData are the data of the ConfigMaps the manager reads.
func (r renderedArgs) templateData() map[string]string {
	data := map[string]string{SandboxTemplateKey: r.template}
	if r.templates != "" {
		data[TemplatesKey] = r.templates
	}
	return data
}

func (r renderedArgs) policyData() map[string]string { return map[string]string{PolicyKey: r.policy} }

// configChecksums are the manager pod template's annotations: one checksum per ConfigMap the
// manager reads.
func (r renderedArgs) configChecksums() pulumi.StringMap {
	return pulumi.StringMap{
		ChecksumAnnotation(TemplateCMName): pulumi.String(DataChecksum(r.templateData())),
		ChecksumAnnotation(PolicyCMName):   pulumi.String(DataChecksum(r.policyData())),
	}
}

// DataChecksum is the hex SHA-256 of a ConfigMap's data: its keys in order, each key and value
// preceded by its length, so that no two different maps hash alike.
func DataChecksum(data map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		for _, s := range []string{k, data[k]} {
			h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(s))))
			h.Write([]byte(s))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
