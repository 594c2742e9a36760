package initconns

import (
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// An identity is told to agents before sFuse only if its certificate carries its key.
func TestIdentityCheck(t *testing.T) {
	mk := func() Identity {
		k, err := tlspin.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := tlspin.MarshalPublicKey(k.Public())
		if err != nil {
			t.Fatal(err)
		}
		c, err := tlspin.Certificate(k)
		if err != nil {
			t.Fatal(err)
		}
		return Identity{SandboxKey: pub, SandboxCertificate: c.Certificate[0]}
	}
	a, b := mk(), mk()
	if err := a.check(); err != nil {
		t.Fatalf("a sandbox's own identity: %v", err)
	}
	for name, tc := range map[string]struct {
		id   Identity
		want string
	}{
		"other key":      {Identity{SandboxKey: b.SandboxKey, SandboxCertificate: a.SandboxCertificate}, "does not carry"},
		"no certificate": {Identity{SandboxKey: a.SandboxKey}, "certificate of 0 bytes"},
		"bad key":        {Identity{SandboxKey: []byte("key"), SandboxCertificate: a.SandboxCertificate}, "bad key"},
		"bad certificate": {Identity{SandboxKey: a.SandboxKey, SandboxCertificate: []byte("certificate")},
			"certificate:"},
	} {
		if err := tc.id.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
}
