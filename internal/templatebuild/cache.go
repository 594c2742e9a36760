package templatebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// keyVersion changes whenever what a key stands for changes (the layers' format, the
// builder's semantics), so that older cache entries are no longer found.
const keyVersion = "fusebox-templatebuild-cache/v1"

// firstKey is the parent key of the first step: the base image's config digest (which holds
// its layers' diff IDs and the Env, WorkingDir and User the steps inherit) and the epoch the
// layers' times are clamped to.
func firstKey(configDigest v1.Hash, epoch time.Time) string {
	return hashKey(keyVersion + "\nbase " + configDigest.String() + "\nepoch " + strconv.FormatInt(epoch.Unix(), 10))
}

// chainKey is a step's key: its parent's, the step's canonical key, and (COPY, ADD) the
// digest of its sources.
func chainKey(parent, stepKey, sources string) string {
	return hashKey(keyVersion + "\nparent " + parent + "\nstep " + strconv.Quote(stepKey) + "\nsources " + sources)
}

func hashKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// stepCache is the cache of steps' layers: DIR/<key>/step.json and, for a step that changed
// something, DIR/<key>/layer.tar.gz. An entry is made in a temporary directory and renamed
// into place, so one that exists is whole.
type stepCache struct {
	dir string
}

// cacheRecord is step.json.
type cacheRecord struct {
	// Empty is set when the step changed nothing: it has no layer.
	Empty bool `json:"empty"`
}

const (
	recordName = "step.json"
	layerName  = "layer.tar.gz"
)

func (c *stepCache) layerPath(key string) string {
	return filepath.Join(c.dir, key, layerName)
}

// get returns the record of key, and whether there is one.
func (c *stepCache) get(key string) (cacheRecord, bool, error) {
	data, err := os.ReadFile(filepath.Join(c.dir, key, recordName))
	if errors.Is(err, fs.ErrNotExist) {
		return cacheRecord{}, false, nil
	}
	if err != nil {
		return cacheRecord{}, false, fmt.Errorf("reading the step cache: %w", err)
	}
	var rec cacheRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return cacheRecord{}, false, fmt.Errorf("step cache entry %s: %w: remove it", filepath.Join(c.dir, key), err)
	}
	if !rec.Empty {
		if _, err := os.Stat(c.layerPath(key)); err != nil {
			return cacheRecord{}, false, fmt.Errorf("step cache entry %s has no layer: remove it", filepath.Join(c.dir, key))
		}
	}
	return rec, true, nil
}

// put records the step of key, moving the compressed layer file into the cache (empty: no
// layer). An entry another build made meanwhile is kept: the same key makes the same layer.
func (c *stepCache) put(key, layer string, empty bool) error {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("creating the step cache: %w", err)
	}
	tmp, err := os.MkdirTemp(c.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("writing the step cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	if !empty {
		if err := os.Rename(layer, filepath.Join(tmp, layerName)); err != nil {
			return fmt.Errorf("writing the step cache: %w", err)
		}
	}
	data, _ := json.Marshal(cacheRecord{Empty: empty})
	if err := os.WriteFile(filepath.Join(tmp, recordName), data, 0o600); err != nil {
		return fmt.Errorf("writing the step cache: %w", err)
	}
	err = os.Rename(tmp, filepath.Join(c.dir, key))
	if err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("writing the step cache: %w", err)
	}
	return nil
}
