package manager

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Steps are the steps of an allocation that AllocationSteps times.
var Steps = []string{"take", "egress", "annotate", "init"}

// Metrics are the manager's Prometheus metrics.
type Metrics struct {
	AllocationSeconds prometheus.Histogram
	// AllocationSteps times the steps of each Allocate that reached them, by step (Steps):
	// whatever serving it cost, a slow allocation shows which step made it slow.
	AllocationSteps *prometheus.HistogramVec
	Units           *prometheus.GaugeVec // by state
	Target          *prometheus.GaugeVec // by template
	Creations       prometheus.Counter
	Destructions    prometheus.Counter
	Failures        *prometheus.CounterVec // by stage: create, init, egress, annotate, destroy
	// CreateFailures counts failed creations by template: a template whose image cannot
	// run the server fails its own pool.
	CreateFailures *prometheus.CounterVec
	Allocations    prometheus.Counter
	ColdWaits      prometheus.Counter // allocations that waited for a creation

	steps map[string]prometheus.Observer // AllocationSteps' children, by step, made once
}

// NewMetrics registers the manager's metrics with reg (a fresh registry in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		AllocationSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fusebox_manager_allocation_seconds", Help: "Time to serve Allocate, sFuse included.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .021, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		AllocationSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fusebox_manager_allocation_step_seconds",
			Help:    "Time of each step of Allocate: take (a ready unit; with a separate claim, its API write), then, concurrently, egress (binding the allowlist; with a one-write claim, after it), annotate (persisting the lease; with a one-write claim, the claim) and init (sFuse with the sandbox).",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .021, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"step"}),
		Units: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_manager_units", Help: "Units by state.",
		}, []string{"state"}),
		Target: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_manager_estimator_target", Help: "The estimator's target number of ready units, by template.",
		}, []string{"template"}),
		Creations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_creations_total", Help: "Units created (reached Ready).",
		}),
		Destructions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_destructions_total", Help: "Units destroyed.",
		}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_manager_failures_total", Help: "Failures by stage.",
		}, []string{"stage"}),
		CreateFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_manager_template_create_failures_total", Help: "Failed creations by template.",
		}, []string{"template"}),
		ColdWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_cold_waits_total", Help: "Allocations that found no ready unit and waited for one to be created.",
		}),
		Allocations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fusebox_manager_allocations_total", Help: "Successful allocations.",
		}),
	}
	reg.MustRegister(m.AllocationSeconds, m.AllocationSteps, m.Units, m.Target, m.Creations, m.Destructions, m.Failures, m.CreateFailures, m.Allocations, m.ColdWaits)
	for _, s := range stateNames {
		m.Units.WithLabelValues(s)
	}
	m.steps = map[string]prometheus.Observer{}
	for _, s := range Steps {
		m.steps[s] = m.AllocationSteps.WithLabelValues(s)
	}
	for _, s := range []string{"create", "init", "egress", "annotate", "destroy"} {
		m.Failures.WithLabelValues(s)
	}
	return m
}
