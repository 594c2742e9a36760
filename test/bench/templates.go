package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// TemplatesOptions configure the templates benchmark.
type TemplatesOptions struct {
	Runsc, SandboxBinary string
	// Image is the default template's image (runscalloc.Options.Image: the sandbox image,
	// whose entrypoint is fusebox-sandbox). Required.
	Image string
	// TemplateImage is the template's image, pinned by digest (a registry reference or
	// /abs/layout@sha256:...), which needs nothing of fusebox. Required.
	TemplateImage string
	// Runs warm allocations of each template, interleaved (default 30); ColdRuns cold starts
	// of each (default 5).
	Runs, ColdRuns int
	// Settle is how long both pools idle, full, before each warm allocation (default 100 ms).
	Settle time.Duration
	Log    *slog.Logger
}

// TemplatesResult is the JSON `fusebox-bench templates --json` prints.
type TemplatesResult struct {
	Image         string `json:"image"`
	TemplateImage string `json:"template_image"`
	// StartS is the allocator's start: both images read and unpacked into the layer store
	// (the template's pull and unpack), apart from the figures below.
	StartS   float64 `json:"start_s"`
	ColdRuns int     `json:"cold_runs"`
	// Cold: an empty pool of each template, an allocation that waits for its unit's creation
	// (runsc create, the server's start, sFuse, the first call), the two templates alternating.
	ColdDefaultP50Ms  float64 `json:"cold_default_p50_ms"`
	ColdTemplateP50Ms float64 `json:"cold_template_p50_ms"`
	// ColdVsDefault is the template's over the default's: the target is at most 1.2.
	ColdVsDefault float64 `json:"cold_vs_default"`
	Runs          int     `json:"runs"`
	// Warm: both pools full and idle, the template's next unit past gVisor's warm-up; one
	// allocation of each per round, in a shuffled order.
	WarmDefaultP50Ms  float64 `json:"warm_default_p50_ms"`
	WarmTemplateP50Ms float64 `json:"warm_template_p50_ms"`
	// WarmVsDefault is the template's over the default's: the target is at most 1.1.
	WarmVsDefault float64 `json:"warm_vs_default"`
	Note          string  `json:"note"`
}

// templateName is the benchmark's template beside the default.
const templateName = "bench"

// Templates measures a template's pool against the default template's, in one manager with
// the runsc allocator in this process: cold starts and warm allocations of each, alternated,
// every one Allocate over gRPC (sFuse included) and the first data-plane call.
func Templates(ctx context.Context, o TemplatesOptions) (*TemplatesResult, error) {
	if o.Image == "" || o.TemplateImage == "" {
		return nil, errors.New("the default template's image and the template's are both required")
	}
	if o.Runs <= 0 {
		o.Runs = 30
	}
	if o.ColdRuns <= 0 {
		o.ColdRuns = 5
	}
	if o.Settle == 0 {
		o.Settle = 100 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	spec := templates.Spec{Name: templateName, Image: o.TemplateImage}
	if err := templates.Validate([]templates.Spec{spec}, "template"); err != nil {
		return nil, err
	}
	def, err := runscalloc.DefaultLimits.Template()
	if err != nil {
		return nil, err
	}
	tmpl, err := runscalloc.FromSpec(spec, runscalloc.DefaultLimits)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fusebox-bench-templates-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	o.Log.Info("starting the allocator: reading and unpacking both images")
	start := time.Now()
	alloc, err := runscalloc.NewContext(ctx, runscalloc.Options{Runsc: o.Runsc, StateDir: dir, SandboxBinary: o.SandboxBinary,
		Image: o.Image, Templates: map[string]runscalloc.Template{manager.DefaultTemplate: def, templateName: tmpl}})
	if err != nil {
		return nil, fmt.Errorf("starting the runsc allocator: %w", err)
	}
	r := &TemplatesResult{Image: o.Image, TemplateImage: o.TemplateImage, StartS: round(time.Since(start).Seconds()),
		ColdRuns: o.ColdRuns, Runs: o.Runs,
		Note: "one manager, two pools: the default template's (the sandbox image) and a template's (its image with fusebox-sandbox bound in); each figure is Allocate over a kept gRPC connection (sFuse included) with a fresh agent key, then the first data-plane call; start_s (reading and unpacking both images) is apart from the figures"}
	defer func() {
		removeContainers(alloc.Runtime(), o.Log)
		alloc.Shutdown(context.WithoutCancel(ctx))
	}()
	est := map[string]*switchable{manager.DefaultTemplate: {}, templateName: {}}
	m, err := manager.New(manager.Options{Allocator: alloc, Templates: []string{manager.DefaultTemplate, templateName},
		Pools: []manager.TemplatePool{{Template: manager.DefaultTemplate, Estimator: est[manager.DefaultTemplate]},
			{Template: templateName, Estimator: est[templateName]}},
		Clock: manager.RealClock{}, Conns: &initconns.Conns{}, ReconcileInterval: 20 * time.Millisecond, Logger: o.Log})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	defer m.Close(context.WithoutCancel(ctx))
	addr, stop, err := ServeManager(m, dir)
	if err != nil {
		return nil, err
	}
	defer stop()
	agent, err := client.NewManager(addr, nil)
	if err != nil {
		return nil, err
	}
	defer agent.Close()
	one := func(name string) (time.Duration, error) {
		a, t0, done, err := timedAllocation(ctx, agent, client.AllocateOptions{Template: name}, nil)
		if err != nil {
			return 0, fmt.Errorf("template %s: %w", name, err)
		}
		return done.Sub(t0), a.Close()
	}
	names := []string{manager.DefaultTemplate, templateName}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))

	// Cold starts: both pools empty and kept empty, the templates alternating.
	o.Log.Info("cold starts", "runs", o.ColdRuns)
	cold := map[string][]float64{}
	for i := range 2 * o.ColdRuns {
		name := names[i%2]
		if err := settled(m, nil); err != nil {
			return nil, err
		}
		d, err := one(name)
		if err != nil {
			return nil, fmt.Errorf("cold allocation: %w", err)
		}
		cold[name] = append(cold[name], ms(d))
	}
	r.ColdDefaultP50Ms, r.ColdTemplateP50Ms = pct(cold[manager.DefaultTemplate], 50), pct(cold[templateName], 50)
	r.ColdVsDefault = round(r.ColdTemplateP50Ms / r.ColdDefaultP50Ms)

	// Warm: a unit of each waiting; one allocation of each per round, in a shuffled order.
	o.Log.Info("warm allocations", "runs", o.Runs)
	for _, e := range est {
		e.set(1)
	}
	warm := map[string][]float64{}
	for range o.Runs {
		order := []string{manager.DefaultTemplate, templateName}
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, name := range order {
			if err := settled(m, names); err != nil {
				return nil, err
			}
			time.Sleep(o.Settle)
			if wait := warmAge - youngestReadyAge(m); wait > 0 {
				time.Sleep(wait)
			}
			d, err := one(name)
			if err != nil {
				return nil, fmt.Errorf("warm allocation: %w", err)
			}
			warm[name] = append(warm[name], ms(d))
		}
	}
	r.WarmDefaultP50Ms, r.WarmTemplateP50Ms = pct(warm[manager.DefaultTemplate], 50), pct(warm[templateName], 50)
	r.WarmVsDefault = round(r.WarmTemplateP50Ms / r.WarmDefaultP50Ms)
	return r, nil
}

// settled waits until m creates and destroys nothing and each template of full has a ready
// unit (with full nil: until no unit is ready at all, the pools empty).
func settled(m *manager.Manager, full []string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok := true
		all := m.States().Counts("")
		if all[manager.Creating] > 0 || all[manager.Destroying] > 0 || (full == nil && all[manager.Ready] > 0) {
			ok = false
		}
		for _, t := range full {
			if m.States().Counts(t)[manager.Ready] < 1 {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pools did not settle: %v", m.Status().Units)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// youngestReadyAge is how long ago the youngest ready unit of m began its creation.
func youngestReadyAge(m *manager.Manager) time.Duration {
	var youngest time.Time
	for _, u := range m.States().Snapshot() {
		if u.State == manager.Ready && u.Info.Created.After(youngest) {
			youngest = u.Info.Created
		}
	}
	if youngest.IsZero() {
		return 0
	}
	return time.Since(youngest)
}
