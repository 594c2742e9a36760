package manager

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// This file holds the lease's codec (the annotations a bound unit's lease is stored under with
// its allocator, for adoption and for every replica of a shared pool) and its checks.

// AnnotationState and AnnotationClaimedAt are what a SharedPool allocator reports for a
// unit a replica has claimed but not bound yet: "claimed", and when (RFC 3339). A unit
// still being made, by whichever replica, is reported with AnnotationState "creating".
const (
	AnnotationState     = annState
	AnnotationClaimedAt = "fusebox.dev/claimed-at"
	// AnnotationFailed is what a SharedPool allocator reports (never stores) for a bound
	// unit whose sandbox ended on its own: the reason, for people ("sandbox server exited:
	// exit code 137"). The unit is then Failed with it: List shows it, Renew is refused
	// naming it, Release destroys the unit, and the leader destroys it when its lease ends.
	// (A shared pool has no ExitWatcher: its units' state is the allocator's view.)
	AnnotationFailed = "fusebox.dev/failed"
)

// Annotation keys under which a bound unit's lease is stored with its allocator.
const (
	annState     = "fusebox.dev/state"
	annExpires   = "fusebox.dev/lease-expires"
	annTTL       = "fusebox.dev/lease-ttl"
	annTokenHash = "fusebox.dev/lease-token-sha256"
	annEgress    = "fusebox.dev/egress"
	annOwner     = "fusebox.dev/owner"
	annLabel     = "fusebox.dev/label."
)

func leaseAnnotations(l *Lease) map[string]string {
	a := map[string]string{
		annState:     "bound",
		annExpires:   l.Expires.UTC().Format(time.RFC3339Nano),
		annTTL:       l.TTL.String(),
		annTokenHash: hex.EncodeToString(l.TokenHash[:]),
		annEgress:    strings.Join(l.Egress, ","),
		annOwner:     l.Owner,
	}
	for k, v := range l.Labels {
		a[annLabel+k] = v
	}
	return a
}

func leaseFromAnnotations(a map[string]string) (*Lease, error) {
	if a[annState] != "bound" {
		return nil, errors.New("not bound")
	}
	exp, err := time.Parse(time.RFC3339Nano, a[annExpires])
	if err != nil {
		return nil, fmt.Errorf("lease expiry: %w", err)
	}
	ttl, err := time.ParseDuration(a[annTTL])
	if err != nil {
		return nil, fmt.Errorf("lease ttl: %w", err)
	}
	h, err := hex.DecodeString(a[annTokenHash])
	if err != nil || len(h) != sha256.Size {
		return nil, errors.New("lease token hash")
	}
	l := &Lease{Owner: a[annOwner], Expires: exp, TTL: ttl, Labels: map[string]string{}}
	copy(l.TokenHash[:], h)
	if e := a[annEgress]; e != "" {
		l.Egress = strings.Split(e, ",")
	}
	for k, v := range a {
		if name, ok := strings.CutPrefix(k, annLabel); ok {
			l.Labels[name] = v
		}
	}
	return l, nil
}

// checkToken reports whether token is the lease's (ErrBadLeaseToken if not), in constant time.
func checkToken(l *Lease, token string) error {
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], l.TokenHash[:]) != 1 {
		return ErrBadLeaseToken
	}
	return nil
}

// leaseTTL is the one check of a requested lease TTL, for Allocate and Renew alike: negative
// is invalid, zero means def, and more than MaxLeaseTTL is capped.
func (m *Manager) leaseTTL(ttl, def time.Duration) (time.Duration, error) {
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("%w: negative lease TTL %v", ErrInvalid, ttl)
	case ttl == 0:
		ttl = def
	}
	return min(ttl, m.o.MaxLeaseTTL), nil
}
