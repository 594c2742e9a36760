package manager

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// This file holds what a lease is to both pools: its codec (the annotations it is stored
// under with its unit), the token check, the renewal rule, the TTL check, and expiry.

// AnnotationState and AnnotationClaimedAt are what a SharedPool allocator reports for a
// unit a replica has claimed but not bound yet: "claimed", and when (RFC 3339).
const (
	AnnotationState     = annState
	AnnotationClaimedAt = "fusebox.dev/claimed-at"
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

func (m *Manager) checkToken(l *Lease, token string) error {
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], l.TokenHash[:]) != 1 {
		return ErrBadLeaseToken
	}
	return nil
}

// extend renews lease l at now, for ttl (zero: the lease's own length, as Renew passes it),
// if token is the lease's and the lease has not ended: the one renewal rule of both pools.
func (m *Manager) extend(l *Lease, token string, ttl time.Duration, now time.Time) error {
	if err := m.checkToken(l, token); err != nil {
		return err
	}
	if !now.Before(l.Expires) {
		return ErrLeaseEnded
	}
	d := l.TTL
	if ttl > 0 {
		d = ttl // checked and capped by Renew
	}
	l.Expires = now.Add(d)
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

// expireLeases destroys the local pool's bound units whose lease ended by now.
func (p *localPool) expireLeases(ctx context.Context, now time.Time) {
	for _, id := range p.ops.Expired(now) {
		if p.destroyInBackground(ctx, id, Bound) == nil { // else released or expired concurrently
			p.log.Info("lease expired; destroying sandbox", "id", id)
		}
	}
}

// expireLease destroys shared unit id if its lease l ended by now, unless a destroy of it
// that an earlier pass started still runs.
func (p *sharedPool) expireLease(ctx context.Context, id string, l *Lease, now time.Time) {
	if !now.Before(l.Expires) && p.expiring.Add(id) {
		p.log.Info("lease expired; destroying sandbox", "id", id)
		p.destroyTracked(ctx, id)
	}
}
