package bench

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/auth"
)

// Two managers' metrics, scraped over HTTP before and after some allocations, give each
// step's mean over both.
func TestScrapeManagerSteps(t *testing.T) {
	var urls []string
	var mets []*manager.Metrics
	var toks []*auth.TokenMetrics
	for range 2 {
		reg := prometheus.NewRegistry()
		mets = append(mets, manager.NewMetrics(reg))
		toks = append(toks, auth.NewTokenMetrics(reg))
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL+"/metrics")
	}
	ctx := context.Background()
	mets[0].AllocationSteps.WithLabelValues("take").Observe(0.5) // before: not counted
	before, err := ScrapeManagerSteps(ctx, urls)
	if err != nil {
		t.Fatal(err)
	}
	mets[0].AllocationSteps.WithLabelValues("take").Observe(0.010)
	mets[1].AllocationSteps.WithLabelValues("take").Observe(0.030)
	mets[1].AllocationSteps.WithLabelValues("init").Observe(0.004)
	toks[1].Reviews.Observe((6 * time.Millisecond).Seconds())
	after, err := ScrapeManagerSteps(ctx, urls)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if got := d.Names(); !slices.Equal(got, []string{"take", "egress", "annotate", "init", "token_review"}) {
		t.Fatalf("Names = %v", got)
	}
	for step, want := range map[string]float64{"take": 20, "init": 4, "egress": 0, "token_review": 6} {
		if got := d[step].MeanMs(); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s mean %v ms, want %v", step, got, want)
		}
	}
	if d["take"].Count != 2 {
		t.Errorf("take counted %d times, want 2", d["take"].Count)
	}
	if _, err := ScrapeManagerSteps(ctx, []string{urls[0] + "-missing"}); err == nil {
		t.Error("a 404 scraped without an error")
	}
}
