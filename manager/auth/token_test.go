package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// jwt makes a token shaped like a ServiceAccount JWT (unsigned: the fake reviewer decides).
func jwt(aud any, exp time.Time, nonce string) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	claims := map[string]any{"aud": aud, "sub": "system:serviceaccount:agents:coder", "jti": nonce}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	return enc(map[string]string{"alg": "RS256"}) + "." + enc(claims) + ".c2ln"
}

// fakeReviewer records calls and answers with review (or err).
type fakeReviewer struct {
	mu     sync.Mutex
	calls  int
	review Review
	err    error
}

func (f *fakeReviewer) Review(_ context.Context, _ string, audiences []string) (Review, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if len(audiences) != 1 || audiences[0] != "fusebox-manager" {
		return Review{}, fmt.Errorf("asked for audiences %q", audiences)
	}
	return f.review, f.err
}

func (f *fakeReviewer) Calls() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

var goodReview = Review{Authenticated: true, Username: "system:serviceaccount:agents:coder", Audiences: []string{"fusebox-manager"}}

type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeNow) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeNow) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newTokens(t *testing.T, r *fakeReviewer, clock *fakeNow, size int) *Tokens {
	t.Helper()
	tk, err := NewTokens(TokenOptions{Review: r.Review, Audience: "fusebox-manager", Now: clock.Now, CacheTTL: 30 * time.Second, CacheSize: size})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTokensAuthenticate(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	good := jwt("fusebox-manager", now.Add(time.Hour), "a")
	tests := []struct {
		name    string
		token   string
		review  Review
		rerr    error
		wantErr error
		msg     string // in the error
		reviews int
	}{
		{"good", good, goodReview, nil, nil, "", 1},
		{"good, audience list", jwt([]string{"other", "fusebox-manager"}, now.Add(time.Hour), "b"), goodReview, nil, nil, "", 1},
		{"no token", "", goodReview, nil, ErrUnauthenticated, `no bearer token: this manager authenticates callers by a Kubernetes ServiceAccount token with audience "fusebox-manager"`, 0},
		{"wrong audience", jwt("https://kubernetes.default.svc", now.Add(time.Hour), "c"), goodReview, nil, ErrUnauthenticated,
			`the token's audience ["https://kubernetes.default.svc"] is not the manager's audience "fusebox-manager"`, 0},
		{"expired", jwt("fusebox-manager", now.Add(-time.Second), "d"), goodReview, nil, ErrUnauthenticated, "the token expired at 2027-01-15T07:59:59Z", 0},
		{"refused by the API", good, Review{Error: "invalid bearer token"}, nil, ErrUnauthenticated,
			`the Kubernetes API refused the token for audience "fusebox-manager": invalid bearer token`, 1},
		{"audience not confirmed", good, Review{Authenticated: true, Username: goodReview.Username}, nil, ErrUnauthenticated,
			`not valid for the manager's audience "fusebox-manager"`, 1},
		{"not a service account", good, Review{Authenticated: true, Username: "alice", Audiences: []string{"fusebox-manager"}}, nil, ErrUnauthenticated,
			`the token's user "alice" is not a ServiceAccount`, 1},
		{"opaque token refused", "not-a-jwt", Review{Error: "invalid bearer token"}, nil, ErrUnauthenticated, "refused the token", 1},
		{"API down", good, Review{}, errors.New("connection refused"), ErrUnavailable, "checking the token with the Kubernetes API (TokenReview): connection refused", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &fakeReviewer{review: tt.review, err: tt.rerr}
			id, err := newTokens(t, r, &fakeNow{t: now}, 0).Authenticate(context.Background(), tt.token)
			if r.Calls() != tt.reviews {
				t.Errorf("%d reviews, want %d", r.Calls(), tt.reviews)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if want := ServiceAccountIdentity("agents", "coder"); id != want {
					t.Fatalf("identity %+v, want %+v", id, want)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.wantErr, tt.msg)
			}
			if tt.token != "" && strings.Contains(err.Error(), tt.token) {
				t.Fatalf("the error carries the token: %v", err)
			}
		})
	}
}

func TestTokensCacheIsBoundedInTime(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	r := &fakeReviewer{review: goodReview}
	tk := newTokens(t, r, clock, 0)
	long := jwt("fusebox-manager", clock.Now().Add(time.Hour), "long")
	auth := func(tok string) {
		t.Helper()
		if _, err := tk.Authenticate(context.Background(), tok); err != nil {
			t.Fatal(err)
		}
	}
	auth(long)
	auth(long)
	if r.Calls() != 1 {
		t.Fatalf("%d reviews for a remembered token, want 1", r.Calls())
	}
	clock.Advance(29 * time.Second)
	auth(long)
	if r.Calls() != 1 {
		t.Fatalf("reviewed again within CacheTTL")
	}
	clock.Advance(time.Second)
	auth(long)
	if r.Calls() != 2 {
		t.Fatalf("%d reviews after CacheTTL, want 2", r.Calls())
	}
	// A token expiring before CacheTTL is remembered until its expiry only, then refused.
	short := jwt("fusebox-manager", clock.Now().Add(10*time.Second), "short")
	auth(short)
	clock.Advance(9 * time.Second)
	auth(short)
	if r.Calls() != 3 {
		t.Fatalf("%d reviews, want 3", r.Calls())
	}
	clock.Advance(time.Second)
	if _, err := tk.Authenticate(context.Background(), short); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired remembered token: %v", err)
	}
}

func TestTokensCacheIsBoundedInSize(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	r := &fakeReviewer{review: goodReview}
	tk := newTokens(t, r, clock, 3)
	toks := make([]string, 5)
	for i := range toks {
		toks[i] = jwt("fusebox-manager", clock.Now().Add(time.Hour), fmt.Sprint(i))
		if _, err := tk.Authenticate(context.Background(), toks[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := tk.cacheLen(); n != 3 {
		t.Fatalf("%d tokens remembered, want 3", n)
	}
	calls := r.Calls()
	tk.Authenticate(context.Background(), toks[4]) // most recent: remembered
	if r.Calls() != calls {
		t.Fatal("the most recent token was not remembered")
	}
	tk.Authenticate(context.Background(), toks[0]) // least recent: evicted
	if r.Calls() != calls+1 {
		t.Fatal("the least recently used token was not evicted")
	}
}

func TestNewTokensRefusesMissingOptions(t *testing.T) {
	if _, err := NewTokens(TokenOptions{Audience: "a"}); err == nil {
		t.Fatal("no reviewer accepted")
	}
	if _, err := NewTokens(TokenOptions{Review: (&fakeReviewer{}).Review}); err == nil {
		t.Fatal("no audience accepted")
	}
}

func TestParseServiceAccountUser(t *testing.T) {
	for _, tt := range []struct {
		in     string
		ns, nm string
		ok     bool
	}{
		{"system:serviceaccount:agents:coder", "agents", "coder", true},
		{"system:serviceaccount:agents", "", "", false},
		{"system:serviceaccount::coder", "", "", false},
		{"system:serviceaccount:a:b:c", "", "", false},
		{"system:node:n1", "", "", false},
	} {
		ns, nm, ok := parseServiceAccountUser(tt.in)
		if ns != tt.ns || nm != tt.nm || ok != tt.ok {
			t.Errorf("parseServiceAccountUser(%q) = %q %q %v", tt.in, ns, nm, ok)
		}
	}
}

func TestTokenMetricsCountReviewsAndCacheHits(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	r := &fakeReviewer{review: goodReview}
	met := NewTokenMetrics(prometheus.NewRegistry())
	tk, err := NewTokens(TokenOptions{Review: r.Review, Audience: "fusebox-manager", Now: clock.Now, Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	tok := jwt("fusebox-manager", clock.Now().Add(time.Hour), "m")
	for range 3 {
		if _, err := tk.Authenticate(context.Background(), tok); err != nil {
			t.Fatal(err)
		}
	}
	var h dto.Metric
	if err := met.Reviews.Write(&h); err != nil {
		t.Fatal(err)
	}
	if n := h.GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("%d reviews timed, want 1", n)
	}
	if n := testutil.ToFloat64(met.CacheHits); n != 2 {
		t.Errorf("%v cache hits, want 2", n)
	}
}

func TestTokensRefuseOversizedTokensUnreviewed(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &fakeReviewer{review: goodReview}
	tk := newTokens(t, r, &fakeNow{t: now}, 0)
	// A well-formed token padded with a claim to the longest that is at most n bytes.
	padded := func(n int) string {
		k := (n - len(jwt("fusebox-manager", now.Add(time.Hour), ""))) * 3 / 4
		for len(jwt("fusebox-manager", now.Add(time.Hour), strings.Repeat("x", k+1))) <= n {
			k++
		}
		return jwt("fusebox-manager", now.Add(time.Hour), strings.Repeat("x", k))
	}
	for _, tc := range []struct {
		name    string
		token   string
		reviews int
		wantErr bool
	}{
		{"1 MiB opaque", strings.Repeat("A", 1<<20), 0, true},
		{"just over the limit JWT", padded(MaxTokenBytes + 3), 0, true},
		{"at the limit", padded(MaxTokenBytes), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.Calls()
			_, err := tk.Authenticate(context.Background(), tc.token)
			if got := r.Calls() - before; got != tc.reviews {
				t.Errorf("%d reviews, want %d", got, tc.reviews)
			}
			if !tc.wantErr {
				if len(tc.token) > MaxTokenBytes {
					t.Fatalf("test token is %d bytes, over the limit", len(tc.token))
				}
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			want := fmt.Sprintf("the bearer token is %d bytes, over the limit of 16384 bytes (16 KiB)", len(tc.token))
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want Unauthenticated containing %q", err, want)
			}
			if len(err.Error()) > 1000 {
				t.Fatalf("the error is %d bytes long", len(err.Error()))
			}
		})
	}
}

func TestTokensRefusalsAreCached(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	r := &fakeReviewer{review: Review{Error: "invalid bearer token"}}
	met := NewTokenMetrics(prometheus.NewRegistry())
	tk, err := NewTokens(TokenOptions{Review: r.Review, Audience: "fusebox-manager", Now: clock.Now, Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	bad := jwt("fusebox-manager", clock.Now().Add(time.Hour), "bad")
	refused := func(what string) {
		t.Helper()
		_, err := tk.Authenticate(context.Background(), bad)
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "refused the token for audience \"fusebox-manager\": invalid bearer token") {
			t.Fatalf("%s: err = %v", what, err)
		}
	}
	refused("first")
	refused("again at once")
	clock.Advance(DefaultRefusalTTL - time.Second)
	refused("again within the refusal TTL")
	if n := r.Calls(); n != 1 {
		t.Fatalf("%d reviews of a token refused three times within %v, want 1", n, DefaultRefusalTTL)
	}
	if n := testutil.ToFloat64(met.RefusalCacheHits); n != 2 {
		t.Errorf("%v refusal cache hits, want 2", n)
	}
	// Remembered briefly only: the refusal may have been transient.
	clock.Advance(time.Second)
	r.mu.Lock()
	r.review = goodReview
	r.mu.Unlock()
	if _, err := tk.Authenticate(context.Background(), bad); err != nil {
		t.Fatalf("after the refusal TTL: %v", err)
	}
	if n := r.Calls(); n != 2 {
		t.Fatalf("%d reviews after the refusal TTL, want 2", n)
	}
	// A review that could not be made is not a refusal: it is not remembered.
	down := &fakeReviewer{err: errors.New("connection refused")}
	tk2 := newTokens(t, down, clock, 0)
	for range 2 {
		if _, err := tk2.Authenticate(context.Background(), bad); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("API down: %v", err)
		}
	}
	if n := down.Calls(); n != 2 {
		t.Fatalf("%d reviews with the API down, want 2 (an unavailable API is not a refusal)", n)
	}
}

func TestTokensRefusalsDoNotEvictAcceptedTokens(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	r := &fakeReviewer{review: goodReview}
	tk := newTokens(t, r, clock, 2)
	good := jwt("fusebox-manager", clock.Now().Add(time.Hour), "good")
	if _, err := tk.Authenticate(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.review = Review{Error: "invalid bearer token"}
	r.mu.Unlock()
	for i := range 10 {
		tk.Authenticate(context.Background(), jwt("fusebox-manager", clock.Now().Add(time.Hour), fmt.Sprint("bad", i)))
	}
	if n := tk.refused.len(); n != 2 {
		t.Errorf("%d refusals remembered, want the cache size 2", n)
	}
	calls := r.Calls()
	if _, err := tk.Authenticate(context.Background(), good); err != nil {
		t.Fatalf("the accepted token was pushed out by refusals: %v", err)
	}
	if r.Calls() != calls {
		t.Fatal("the accepted token was reviewed again after refusals of others")
	}
}
