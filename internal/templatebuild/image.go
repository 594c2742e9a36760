package templatebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/sbom"
)

// Names the layout and the image carry.
const (
	// AnnotationRefName names the image in the layout's index.json.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationBaseDigest is the manifest annotation holding the base image's digest (OCI
	// pre-defined annotation).
	AnnotationBaseDigest = "org.opencontainers.image.base.digest"
	// AnnotationDockerfile is the manifest annotation holding the Dockerfile's digest.
	AnnotationDockerfile = "dev.fusebox.template.dockerfile.digest"
	// AnnotationEgress is the manifest annotation holding the RUN steps' egress allowlist,
	// its entries sorted and joined by ","; absent for a build without network.
	AnnotationEgress = "dev.fusebox.template.egress"
	// RecordFile is the build record's name in the layout directory, beside index.json.
	RecordFile = "fusebox-build.json"
	// SBOMFile is the image's SBOM (SPDX 2.3 JSON) in the layout directory: what its
	// filesystem says is installed (package sbom).
	SBOMFile = "sbom.spdx.json"
)

// builtStep is one step of the build, as the image's history and the record show it.
type builtStep struct {
	line   int
	text   string
	empty  bool     // no layer
	cached bool     // taken from the cache
	layer  v1.Layer // nil when empty
}

// instruction shows step s as the history and the progress do, after substitution.
func instruction(s dockerfile.Step) string {
	quote := func(vs []string) string {
		b, _ := json.Marshal(vs)
		return string(b)
	}
	pairs := func(kvs []dockerfile.KeyValue) string {
		var parts []string
		for _, kv := range kvs {
			parts = append(parts, kv.Key+"="+strconv.Quote(kv.Value))
		}
		return strings.Join(parts, " ")
	}
	switch s.Kind {
	case dockerfile.KindRun:
		if s.Argv != nil {
			return "RUN " + quote(s.Argv)
		}
		return "RUN /bin/sh -c " + s.Shell
	case dockerfile.KindCopy, dockerfile.KindAdd:
		var flags string
		if s.Chown != "" {
			flags += " --chown=" + s.Chown
		}
		if s.Chmod != nil {
			flags += fmt.Sprintf(" --chmod=%04o", *s.Chmod)
		}
		return string(s.Kind) + flags + " " + strings.Join(s.Sources, " ") + " " + s.Dest
	case dockerfile.KindEnv, dockerfile.KindLabel:
		return string(s.Kind) + " " + pairs(s.Pairs)
	case dockerfile.KindWorkdir:
		return "WORKDIR " + s.Workdir
	case dockerfile.KindUser:
		return "USER " + s.User
	}
	return string(s.Kind)
}

// assemble makes the image of the base's layers and layers, with cfg. history, if set, is
// the history of the steps (it is left out of the partial images the cache unpacks).
func (bd *build) assemble(layers []v1.Layer, history []v1.History, cfg v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	baseLayers, err := bd.base.img.Layers()
	if err != nil {
		return nil, fmt.Errorf("reading the base image's layers: %w", err)
	}
	var adds []mutate.Addendum
	for _, l := range baseLayers {
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("reading the base image's layers: %w", err)
		}
		// The same bytes under the OCI media type, so that the manifest is all OCI.
		switch mt {
		case types.DockerLayer:
			mt = types.OCILayer
		case types.DockerUncompressedLayer:
			mt = types.OCIUncompressedLayer
		case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
			return nil, fmt.Errorf("the base image has a foreign layer (%s), which cannot be copied", mt)
		}
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: mt})
	}
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCILayer})
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return nil, fmt.Errorf("assembling the image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("assembling the image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", runtime.GOARCH, bd.base.cf.Variant
	cf.Created = v1.Time{Time: bd.o.Epoch}
	cf.Config = cfg
	cf.Author, cf.Container, cf.DockerVersion = "", "", ""
	cf.History = append(bd.baseHistory(len(baseLayers)), history...)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("assembling the image: %w", err)
	}
	return img, nil
}

// baseHistory returns the base image's history, or one entry per layer when it has none
// that matches its layers (the history's non-empty entries must be the layers).
func (bd *build) baseHistory(layers int) []v1.History {
	h := bd.base.cf.History
	n := 0
	for _, e := range h {
		if !e.EmptyLayer {
			n++
		}
	}
	if n == layers {
		return append([]v1.History(nil), h...)
	}
	out := make([]v1.History, layers)
	for i := range out {
		out[i] = v1.History{Created: bd.base.cf.Created, Comment: "base image " + bd.base.digest.String()}
	}
	return out
}

// record is the build record written beside the image in the layout.
type record struct {
	Tag        string            `json:"tag"`
	Digest     string            `json:"digest"`
	Dockerfile string            `json:"dockerfile"`
	Base       recordBase        `json:"base"`
	BuildArgs  map[string]string `json:"buildArgs,omitempty"`
	Unused     []string          `json:"unusedBuildArgs,omitempty"`
	Epoch      int64             `json:"epoch"`
	// Egress is the RUN steps' egress allowlist (canonical, sorted); absent: no network.
	Egress []string     `json:"egress,omitempty"`
	Steps  []recordStep `json:"steps"`
	SBOM   recordSBOM   `json:"sbom"`
}

// recordSBOM names the SBOM beside the record.
type recordSBOM struct {
	File     string `json:"file"`
	SHA256   string `json:"sha256"`
	Packages int    `json:"packages"`
}

type recordBase struct {
	From   string `json:"from"`
	Pinned string `json:"pinned"`
	Digest string `json:"digest"`
}

type recordStep struct {
	Line        int    `json:"line"`
	Instruction string `json:"instruction"`
	Layer       string `json:"layer,omitempty"`
	Cached      bool   `json:"cached,omitempty"`
}

// finish assembles the image and writes the layout with the record.
func (bd *build) finish(ctx context.Context, dockerfileDigest string) (*Result, error) {
	var layers []v1.Layer
	var history []v1.History
	rec := record{
		Tag: bd.o.Tag, Dockerfile: dockerfileDigest, BuildArgs: bd.o.BuildArgs, Unused: bd.stage.UnusedBuildArgs,
		Epoch: bd.o.Epoch.Unix(), Egress: bd.o.Egress,
		Base: recordBase{From: bd.stage.From, Pinned: bd.base.pinned, Digest: bd.base.digest.String()},
	}
	for _, s := range bd.steps {
		h := v1.History{Created: v1.Time{Time: bd.o.Epoch}, CreatedBy: s.text, EmptyLayer: s.empty}
		rs := recordStep{Line: s.line, Instruction: s.text, Cached: s.cached}
		if !s.empty {
			layers = append(layers, s.layer)
			d, err := s.layer.Digest()
			if err != nil {
				return nil, fmt.Errorf("reading the layer of line %d: %w", s.line, err)
			}
			rs.Layer = d.String()
		}
		history = append(history, h)
		rec.Steps = append(rec.Steps, rs)
	}
	img, err := bd.assemble(layers, history, bd.cfg)
	if err != nil {
		return nil, err
	}
	annotations := map[string]string{
		AnnotationBaseDigest: bd.base.digest.String(),
		AnnotationDockerfile: dockerfileDigest,
	}
	if len(bd.o.Egress) > 0 {
		annotations[AnnotationEgress] = strings.Join(bd.o.Egress, ",")
	}
	img = mutate.Annotations(img, annotations).(v1.Image)
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("assembling the image: %w", err)
	}
	rec.Digest = digest.String()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	bom := sbom.New(sbom.Meta{Name: "template-" + bd.o.Tag, ID: bd.o.Tag, Tool: "fusebox template build",
		Comment: "the image " + digest.String() + ", built by fusebox template build"})
	if err := sbom.FromImage(img, bom); err != nil {
		return nil, fmt.Errorf("listing the image's packages: %w", err)
	}
	doc, err := bom.Document(bd.o.Epoch)
	if err != nil {
		return nil, fmt.Errorf("writing the SBOM: %w", err)
	}
	sum := sha256.Sum256(doc)
	rec.SBOM = recordSBOM{File: SBOMFile, SHA256: hex.EncodeToString(sum[:]), Packages: bom.Len()}
	fmt.Fprintf(bd.o.Progress, "SBOM: %d packages in %s\n", bom.Len(), filepath.Join(bd.o.Out, SBOMFile))
	if err := writeLayout(bd.o.Out, bd.o.Tag, img, rec, doc); err != nil {
		return nil, fmt.Errorf("writing the image layout %s: %w", bd.o.Out, err)
	}
	res := bd.res
	res.Digest, res.Dir, res.Reference, res.Layers = digest, bd.o.Out, bd.o.Out+"@"+digest.String(), len(layers)
	res.SBOM, res.Packages = filepath.Join(bd.o.Out, SBOMFile), bom.Len()
	return &res, nil
}

// writeLayout writes img as the OCI layout out, with the record and the SBOM, through a
// temporary directory beside it renamed into place: a failure leaves out as it was.
func writeLayout(out, tag string, img v1.Image, rec record, bom []byte) (err error) {
	parent := filepath.Dir(out)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{AnnotationRefName: tag})); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, RecordFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, SBOMFile), bom, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	old := out + ".old"
	os.RemoveAll(old)
	if err := os.Rename(out, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Rename(old, out)
		return err
	}
	return os.RemoveAll(old)
}
