package client

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// testAllocation is an Allocation as Manager.Allocate makes it, without a manager: what
// ExportSession reads.
func testAllocation(t *testing.T, key *Key) *Allocation {
	t.Helper()
	other, err := NewKey() // stands in for the sandbox's key
	if err != nil {
		t.Fatal(err)
	}
	resp := &managerv1.AllocateResponse{SandboxId: "fbx-1", Endpoint: "unix:///run/fbx-1.sock",
		SandboxPublicKey: other.PublicKey(), LeaseToken: "token-1"}
	return &Allocation{ID: "fbx-1", key: key, session: newSession("unix:///run/m.sock", resp, key)}
}

// TestSessionKeyRoundTrip: an exported session parses back from its JSON, and its agent key
// opens (sealed, with the seal key; in the clear) to the allocation's own key, for Ed25519
// and ECDSA keys; a wrong seal key, a document moved to another sandbox, or a missing seal
// key do not open it.
func TestSessionKeyRoundTrip(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := KeyFromSigner(ec)
	if err != nil {
		t.Fatal(err)
	}
	edKey, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	seal := bytes.Repeat([]byte{7}, SealKeySize)
	for name, key := range map[string]*Key{"ed25519": edKey, "ecdsa": ecKey} {
		a := testAllocation(t, key)
		for _, o := range []ExportOptions{{SealKey: seal}, {Plain: true}} {
			s, err := a.ExportSession(o)
			if err != nil {
				t.Fatalf("%s: ExportSession: %v", name, err)
			}
			b, err := s.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseSession(b)
			if err != nil {
				t.Fatalf("%s: ParseSession: %v\n%s", name, err, b)
			}
			var sealKey []byte
			if o.SealKey != nil {
				sealKey = seal
			}
			k, err := back.Key(sealKey)
			if err != nil || !bytes.Equal(k.PublicKey(), key.PublicKey()) {
				t.Fatalf("%s %+v: Key = %v, %v; want the allocation's key", name, o, k, err)
			}
		}
	}

	a := testAllocation(t, edKey)
	s, _ := a.ExportSession(ExportOptions{SealKey: seal})
	wrong := bytes.Repeat([]byte{8}, SealKeySize)
	if _, err := s.Key(wrong); !errors.Is(err, ErrSessionKey) {
		t.Errorf("a wrong seal key: %v, want ErrSessionKey", err)
	}
	moved := *s
	moved.SandboxID = "fbx-2"
	if _, err := moved.Key(seal); !errors.Is(err, ErrSessionKey) {
		t.Errorf("the sealed key in another sandbox's document: %v, want ErrSessionKey", err)
	}
	cut := *s
	cut.AgentKey = &SessionKey{Seal: SealAESGCM, Nonce: s.AgentKey.Nonce[:4], Data: s.AgentKey.Data}
	if _, err := cut.Key(seal); !errors.Is(err, ErrSessionKey) {
		t.Errorf("a cut nonce: %v, want ErrSessionKey (and no panic)", err)
	}
	if _, err := s.Key(nil); err == nil || !strings.Contains(err.Error(), "give the seal key") {
		t.Errorf("no seal key: %v", err)
	}
	if _, err := s.Key(seal[:16]); err == nil || !strings.Contains(err.Error(), "want 32") {
		t.Errorf("a short seal key: %v", err)
	}
	if _, err := a.ExportSession(ExportOptions{SealKey: seal, Plain: true}); err == nil {
		t.Error("SealKey and Plain together: no error")
	}
	bare, _ := a.ExportSession(ExportOptions{})
	if bare.AgentKey != nil {
		t.Errorf("ExportSession without options carries a key: %+v", bare.AgentKey)
	}
	if err := bare.checkKey(ecKey); !errors.Is(err, ErrSessionKey) {
		t.Errorf("another key against the session: %v, want ErrSessionKey", err)
	}
}

// TestParseSessionRefusals: documents of another version, with a field missing, an unknown
// field or an unknown seal are refused, naming what is wrong.
func TestParseSessionRefusals(t *testing.T) {
	key, _ := NewKey()
	s, err := testAllocation(t, key).ExportSession(ExportOptions{Plain: true})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := s.Marshal()
	for _, c := range []struct{ from, to, want string }{
		{SessionVersion, "fusebox.session/v9", "version"},
		{`"lease_token": "token-1"`, `"lease_token": ""`, "lease_token is missing"},
		{`"seal": "none"`, `"seal": "rot13"`, "rot13"},
		{`"sandbox_id"`, `"surprise": 1, "sandbox_id"`, "surprise"},
	} {
		bad := strings.Replace(string(good), c.from, c.to, 1)
		if bad == string(good) {
			t.Fatalf("%q not in the document:\n%s", c.from, good)
		}
		if _, err := ParseSession([]byte(bad)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s → %s: %v, want an error naming %q", c.from, c.to, err, c.want)
		}
	}
}

// TestWriteSessionFile: the file is its owner's only, and replaces an earlier one whole.
func TestWriteSessionFile(t *testing.T) {
	key, _ := NewKey()
	s, _ := testAllocation(t, key).ExportSession(ExportOptions{Plain: true})
	p := filepath.Join(t.TempDir(), "s.json")
	os.WriteFile(p, []byte("old"), 0o644)
	if err := WriteSessionFile(p, s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	back, err := ReadSessionFile(p)
	if err != nil || back.SandboxID != "fbx-1" {
		t.Fatalf("ReadSessionFile: %+v, %v", back, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want only the file", len(entries))
	}
}
