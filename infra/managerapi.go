package infra

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"
)

// checkAPI checks the keys that secure the manager's API:
//   - manager.tlsSecret names a TLS Secret in the manager namespace that the operator provides
//     (tls.crt, tls.key, ca.crt: a cert-manager Certificate's secretName); empty, the manager
//     makes its own with a self-signed CA;
//   - manager.tokenAudience is the audience agents' ServiceAccount tokens must carry (default
//     fusebox-manager);
//   - manager.externalNames are the DNS names and IP addresses agents outside the cluster reach
//     the manager by (a LoadBalancer's), which the certificate the manager makes covers beside
//     the Service's in-cluster names. With tlsSecret the certificate and its names are the
//     operator's, so they are refused together.
func (m ManagerConfig) checkAPI(fail failFunc) error {
	if m.TLSSecret != "" {
		if errs := validation.IsDNS1123Subdomain(m.TLSSecret); len(errs) > 0 {
			return fail("manager.tlsSecret", fmt.Errorf("%q is not a Secret name: %s", m.TLSSecret, strings.Join(errs, "; ")))
		}
	}
	if m.TokenAudience != "" && strings.ContainsFunc(m.TokenAudience, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) || r == ',' }) {
		return fail("manager.tokenAudience", fmt.Errorf("%q: an audience has no spaces, commas or control characters", m.TokenAudience))
	}
	if len(m.ExternalNames) > 0 && m.TLSSecret != "" {
		return fail("manager.externalNames", errors.New("the certificate is the one in manager.tlsSecret: put these names in it (a cert-manager Certificate's dnsNames and ipAddresses) and leave externalNames out"))
	}
	for i, n := range m.ExternalNames {
		if err := checkExternalName(n); err != nil {
			return fail(fmt.Sprintf("manager.externalNames[%d]", i), err)
		}
	}
	return nil
}

// checkExternalName accepts a DNS name (lower case, no wildcard) or an IP address.
func checkExternalName(n string) error {
	if a, err := netip.ParseAddr(n); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("%q: an IP address without a zone", n)
		}
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
		return fmt.Errorf("%q is neither an IP address nor a DNS name: %s", n, strings.Join(errs, "; "))
	}
	return nil
}
