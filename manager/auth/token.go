package auth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Review is what a TokenReview says of a token.
type Review struct {
	Authenticated bool
	// Username is the token's user ("system:serviceaccount:<namespace>:<name>").
	Username string
	// Audiences are the requested audiences the token is valid for.
	Audiences []string
	// Error is the API server's reason for refusing the token.
	Error string
}

// TokenReviewer checks token for audiences with the Kubernetes API (KubeTokenReviewer) and
// returns the review; an error means the review could not be made, not that the token is bad.
type TokenReviewer func(ctx context.Context, token string, audiences []string) (Review, error)

// Defaults of TokenOptions.
const (
	DefaultCacheTTL  = 30 * time.Second
	DefaultCacheSize = 4096
	// DefaultRefusalTTL is how long a token the Kubernetes API refused is refused again
	// without a new review.
	DefaultRefusalTTL = 10 * time.Second
)

// MaxTokenBytes bounds a bearer token: a longer one is refused before anything else is done
// with it (no decoding, no hash, no TokenReview). ServiceAccount tokens are about 1 KiB, and
// OIDC tokens with many groups a few KiB; the API server would accept far larger ones, so
// without the bound any caller who reaches the port could have the manager send megabytes
// to the Kubernetes API per call.
const MaxTokenBytes = 16 << 10

// TokenOptions configure Tokens.
type TokenOptions struct {
	// Review checks tokens. Required.
	Review TokenReviewer
	// Audience is the manager's audience: a token must carry it. Required.
	Audience string
	// CacheTTL bounds how long an accepted token is trusted without a new review (default
	// DefaultCacheTTL; never past the token's own expiry). It is how long a deleted
	// ServiceAccount's token may still be accepted.
	CacheTTL time.Duration
	// CacheSize bounds the accepted tokens remembered (least recently used go first; default
	// DefaultCacheSize), and apart from them the refused tokens remembered: a caller
	// presenting many bad tokens cannot push good ones out.
	CacheSize int
	// RefusalTTL bounds how long a token the Kubernetes API refused is refused again without
	// a new review (default DefaultRefusalTTL, never more than CacheTTL), so that repeating a
	// bad token does not repeat the review. Short: a refusal may be a transient one (a token
	// presented before the API server knows its ServiceAccount).
	RefusalTTL time.Duration
	// Now tells the time (nil: time.Now).
	Now func() time.Time
	// Metrics count reviews and cache hits (nil: not counted).
	Metrics *TokenMetrics
}

// TokenMetrics are Tokens' Prometheus metrics.
type TokenMetrics struct {
	// Reviews times the TokenReviews made: its count is the tokens the cache did not hold.
	Reviews prometheus.Histogram
	// CacheHits counts the tokens accepted from the cache, without a review.
	CacheHits prometheus.Counter
	// RefusalCacheHits counts the tokens refused from the cache, without a review.
	RefusalCacheHits prometheus.Counter
}

// NewTokenMetrics registers Tokens' metrics with reg.
func NewTokenMetrics(reg prometheus.Registerer) *TokenMetrics {
	m := &TokenMetrics{
		Reviews: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fusebox_manager_token_review_seconds", Help: "Time of each TokenReview of a caller's token the cache did not hold.",
			Buckets: []float64{.001, .002, .005, .01, .021, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		CacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_token_cache_hits_total", Help: "Callers' tokens accepted from the cache, without a TokenReview.",
		}),
		RefusalCacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_token_refusal_cache_hits_total", Help: "Callers' tokens refused from the cache of recent refusals, without a TokenReview.",
		}),
	}
	reg.MustRegister(m.Reviews, m.CacheHits, m.RefusalCacheHits)
	return m
}

// Tokens authenticates bearer tokens: Kubernetes ServiceAccount tokens with the manager's
// audience, checked by TokenReview. Tokens longer than MaxTokenBytes are refused unread.
// Accepted tokens, and apart from them the tokens the review refused, are remembered by their
// SHA-256 (never the token itself), for a bounded time and in a bounded number. It is safe for
// concurrent use.
type Tokens struct {
	o        TokenOptions
	accepted *tokenCache // of Identity
	refused  *tokenCache // of the refusal's error
}

// NewTokens returns a token authenticator; it refuses a missing reviewer or audience.
func NewTokens(o TokenOptions) (*Tokens, error) {
	switch {
	case o.Review == nil:
		return nil, errors.New("auth: a token reviewer is required")
	case o.Audience == "":
		return nil, errors.New("auth: the manager's token audience is required")
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = DefaultCacheTTL
	}
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.RefusalTTL <= 0 {
		o.RefusalTTL = DefaultRefusalTTL
	}
	o.RefusalTTL = min(o.RefusalTTL, o.CacheTTL)
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Tokens{o: o, accepted: newTokenCache(o.CacheSize), refused: newTokenCache(o.CacheSize)}, nil
}

// claims are the parts of a JWT's payload read before the review, only to refuse early with
// a precise reason and to bound the cache: the review alone decides that a token is good.
type claims struct {
	Exp int64           `json:"exp"`
	Aud json.RawMessage `json:"aud"`
}

func (c claims) audiences() []string {
	var one string
	if json.Unmarshal(c.Aud, &one) == nil {
		return []string{one}
	}
	var many []string
	json.Unmarshal(c.Aud, &many)
	return many
}

// peek decodes token's payload without verifying it; ok is false for a token that is not a
// JWT.
func peek(token string) (claims, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return claims{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return claims{}, false
	}
	var c claims
	if json.Unmarshal(raw, &c) != nil {
		return claims{}, false
	}
	return c, true
}

// Authenticate returns the ServiceAccount token belongs to.
func (t *Tokens) Authenticate(ctx context.Context, token string) (Identity, error) {
	aud := t.o.Audience
	if token == "" {
		return Identity{}, fmt.Errorf("%w: no bearer token: this manager authenticates callers by a Kubernetes ServiceAccount token with audience %q "+
			"(fusebox --token-file or $FUSEBOX_TOKEN_FILE; in a pod, a projected serviceAccountToken volume with that audience)", ErrUnauthenticated, aud)
	}
	if len(token) > MaxTokenBytes {
		return Identity{}, fmt.Errorf("%w: the bearer token is %d bytes, over the limit of %d bytes (%d KiB): Kubernetes ServiceAccount tokens are far smaller",
			ErrUnauthenticated, len(token), MaxTokenBytes, MaxTokenBytes>>10)
	}
	now := t.o.Now()
	c, jwt := peek(token)
	if jwt {
		if auds := c.audiences(); !slices.Contains(auds, aud) {
			return Identity{}, fmt.Errorf("%w: the token's audience %q is not the manager's audience %q: project the token with audience %q",
				ErrUnauthenticated, auds, aud, aud)
		}
		if c.Exp != 0 && !now.Before(time.Unix(c.Exp, 0)) {
			return Identity{}, fmt.Errorf("%w: the token expired at %s: projected tokens are renewed by the kubelet; read the token file again (the SDK does on every call)",
				ErrUnauthenticated, time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
		}
	}
	key := sha256.Sum256([]byte(token))
	if v, ok := t.accepted.lookup(key, now); ok {
		if t.o.Metrics != nil {
			t.o.Metrics.CacheHits.Inc()
		}
		return v.(Identity), nil
	}
	if v, ok := t.refused.lookup(key, now); ok {
		if t.o.Metrics != nil {
			t.o.Metrics.RefusalCacheHits.Inc()
		}
		return Identity{}, v.(error)
	}
	reviewing := time.Now()
	r, err := t.o.Review(ctx, token, []string{aud})
	if t.o.Metrics != nil {
		t.o.Metrics.Reviews.Observe(time.Since(reviewing).Seconds())
	}
	if err != nil {
		// Not a refusal: the next call reviews again.
		return Identity{}, fmt.Errorf("%w: checking the token with the Kubernetes API (TokenReview): %v", ErrUnavailable, err)
	}
	id, err := reviewed(r, aud)
	if err != nil {
		t.refused.store(key, err, now.Add(t.o.RefusalTTL))
		return Identity{}, err
	}
	until := now.Add(t.o.CacheTTL)
	if jwt && c.Exp != 0 {
		until = minTime(until, time.Unix(c.Exp, 0))
	}
	t.accepted.store(key, id, until)
	return id, nil
}

// reviewed returns the identity review r gives a token for audience aud, or the refusal.
func reviewed(r Review, aud string) (Identity, error) {
	if !r.Authenticated {
		reason := r.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return Identity{}, fmt.Errorf("%w: the Kubernetes API refused the token for audience %q: %s", ErrUnauthenticated, aud, reason)
	}
	if !slices.Contains(r.Audiences, aud) {
		return Identity{}, fmt.Errorf("%w: the token is not valid for the manager's audience %q (valid for %q)", ErrUnauthenticated, aud, r.Audiences)
	}
	ns, name, ok := parseServiceAccountUser(r.Username)
	if !ok {
		return Identity{}, fmt.Errorf("%w: the token's user %q is not a ServiceAccount: the manager accepts ServiceAccount tokens only", ErrUnauthenticated, r.Username)
	}
	return ServiceAccountIdentity(ns, name), nil
}

// parseServiceAccountUser splits "system:serviceaccount:<namespace>:<name>".
func parseServiceAccountUser(u string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(u, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	if !ok || namespace == "" || name == "" || strings.Contains(name, ":") {
		return "", "", false
	}
	return namespace, name, true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// tokenCache remembers a value per token, keyed by the token's SHA-256, until a given time
// and for at most size tokens (the least recently used go first).
type tokenCache struct {
	size int

	mu    sync.Mutex // guards lru and byKey
	lru   *list.List // of *cached, most recently used first
	byKey map[[32]byte]*list.Element
}

type cached struct {
	key   [32]byte
	val   any
	until time.Time
}

func newTokenCache(size int) *tokenCache {
	return &tokenCache{size: size, lru: list.New(), byKey: map[[32]byte]*list.Element{}}
}

func (tc *tokenCache) lookup(key [32]byte, now time.Time) (any, bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	el, ok := tc.byKey[key]
	if !ok {
		return nil, false
	}
	c := el.Value.(*cached)
	if !now.Before(c.until) {
		tc.lru.Remove(el)
		delete(tc.byKey, key)
		return nil, false
	}
	tc.lru.MoveToFront(el)
	return c.val, true
}

func (tc *tokenCache) store(key [32]byte, val any, until time.Time) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if el, ok := tc.byKey[key]; ok {
		el.Value = &cached{key: key, val: val, until: until}
		tc.lru.MoveToFront(el)
		return
	}
	tc.byKey[key] = tc.lru.PushFront(&cached{key: key, val: val, until: until})
	for tc.lru.Len() > tc.size {
		old := tc.lru.Back()
		tc.lru.Remove(old)
		delete(tc.byKey, old.Value.(*cached).key)
	}
}

func (tc *tokenCache) len() int {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.lru.Len()
}

// cacheLen is the number of remembered accepted tokens (tests).
func (t *Tokens) cacheLen() int { return t.accepted.len() }
