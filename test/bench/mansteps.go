package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fusebox-dev/fusebox/manager"
)

// ManagerSteps are the totals of the manager-side histograms that split an allocation: the
// allocation steps (manager.Steps) and the TokenReviews, summed over the managers scraped.
// Two scrapes' difference (Sub) covers what happened between them.
type ManagerSteps map[string]StepTotal

// StepTotal is one histogram's count and sum (seconds).
type StepTotal struct {
	Count uint64
	Sum   float64
}

// MeanMs is the mean observation in milliseconds (0 without any).
func (s StepTotal) MeanMs() float64 {
	if s.Count == 0 {
		return 0
	}
	return s.Sum / float64(s.Count) * 1000
}

// Sub returns s less before, step by step.
func (s ManagerSteps) Sub(before ManagerSteps) ManagerSteps {
	out := ManagerSteps{}
	for k, v := range s {
		b := before[k]
		out[k] = StepTotal{Count: v.Count - b.Count, Sum: v.Sum - b.Sum}
	}
	return out
}

// Names are s's steps in the allocation's order (manager.Steps), then "token_review".
func (s ManagerSteps) Names() []string {
	var names []string
	for _, n := range append(slices.Clone(manager.Steps), "token_review") {
		if _, ok := s[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// ScrapeManagerSteps reads each manager's /metrics (urls: http://host:port/metrics) and sums
// fusebox_manager_allocation_step_seconds by step, and fusebox_manager_token_review_seconds
// as step "token_review".
func ScrapeManagerSteps(ctx context.Context, urls []string) (ManagerSteps, error) {
	out := ManagerSteps{}
	add := func(step string, h *dto.Histogram) {
		t := out[step]
		t.Count += h.GetSampleCount()
		t.Sum += h.GetSampleSum()
		out[step] = t
	}
	for _, u := range urls {
		fams, err := scrape(ctx, u)
		if err != nil {
			return nil, err
		}
		if f := fams["fusebox_manager_allocation_step_seconds"]; f != nil {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "step" {
						add(l.GetValue(), m.GetHistogram())
					}
				}
			}
		}
		if f := fams["fusebox_manager_token_review_seconds"]; f != nil {
			for _, m := range f.GetMetric() {
				add("token_review", m.GetHistogram())
			}
		}
	}
	return out, nil
}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("scraping %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	return fams, nil
}
