package kubealloc

import (
	"maps"
	"net/http"
	"strings"
	"sync"
)

// RequestCounts counts API requests by Kubernetes verb (get, list, watch, create, update,
// patch, delete, deletecollection). Safe for concurrent use.
type RequestCounts struct {
	mu sync.Mutex // guards m
	m  map[string]int
}

// Snapshot returns a copy of the counts.
func (c *RequestCounts) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// Writes is create+update+patch+delete+deletecollection in s.
func Writes(s map[string]int) int {
	return s["create"] + s["update"] + s["patch"] + s["delete"] + s["deletecollection"]
}

// Diff returns after-before per verb (verbs that did not change are left out).
func Diff(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func (c *RequestCounts) add(verb string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[verb]++
}

// NewCountingTransport wraps next so that every request is counted in c. Use it as a
// rest.Config WrapTransport:
//
//	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return kubealloc.NewCountingTransport(c, rt) })
func NewCountingTransport(c *RequestCounts, next http.RoundTripper) http.RoundTripper {
	return countingTransport{c: c, next: next}
}

type countingTransport struct {
	c    *RequestCounts
	next http.RoundTripper
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.add(requestVerb(r))
	return t.next.RoundTrip(r)
}

// requestVerb maps a REST request to its Kubernetes verb from the URL's shape:
// /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUB]] or /apis/GROUP/VERSION/...
func requestVerb(r *http.Request) string {
	seg := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return strings.ToLower(r.Method) // discovery, /readyz, ...
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	collection := len(seg) <= 1
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			return "watch"
		case collection:
			return "list"
		}
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		if collection {
			return "deletecollection"
		}
		return "delete"
	}
	return strings.ToLower(r.Method)
}
