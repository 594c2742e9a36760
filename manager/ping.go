package manager

import (
	"context"
	"time"
)

// pingFailures is how many pings in a row a ready unit may miss before it is destroyed.
const pingFailures = 3

// pingHead pings the unit the next allocation of each pool's template will take (its oldest
// ready one) every PingInterval, until ctx ends or stop closes: a liveness check, so that a
// unit whose sandbox died in the pool is destroyed (after pingFailures misses in a row,
// counted as a "ping" failure) and replaced, instead of failing an allocation first. Pinging
// more often does not make the unit faster to allocate (docs/performance.md), and a ping that
// meets an allocation delays it.
func (p *warmPool) pingHead(ctx context.Context, stop <-chan struct{}) {
	t := p.o.Clock.NewTicker(p.o.PingInterval)
	defer t.Stop()
	missed := map[string]*headMisses{} // by template
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C():
		}
		for _, tp := range p.templates.pools() {
			if missed[tp.Template] == nil {
				missed[tp.Template] = &headMisses{}
			}
			p.pingOnce(ctx, tp.Template, missed[tp.Template])
		}
	}
}

// headMisses counts the pings a pool's head unit missed in a row.
type headMisses struct {
	id string
	n  int
}

// pingOnce pings tmpl's head unit, and destroys it once it has missed pingFailures in a row.
func (p *warmPool) pingOnce(ctx context.Context, tmpl string, m *headMisses) {
	ids := p.ops.OldestReady(tmpl, 1)
	if len(ids) == 0 {
		return
	}
	u, ok := p.ops.Get(ids[0])
	if !ok || u.State != Ready {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, max(p.o.PingInterval, time.Second))
	err := p.o.Conns.Ping(pctx, u.Info.InitAddr)
	cancel()
	if err == nil || ctx.Err() != nil {
		m.id, m.n = "", 0
		return
	}
	if u.Info.ID != m.id {
		m.id, m.n = u.Info.ID, 0
	}
	m.n++
	p.log.Warn("ready unit missed a ping", "id", u.Info.ID, "template", tmpl, "missed", m.n, "err", err)
	if m.n < pingFailures {
		return
	}
	m.id, m.n = "", 0
	p.tally.failure("ping")
	p.bg.do(func() {
		// Fails harmlessly if an allocation took the unit meanwhile: it is then the
		// allocation's to fail.
		if err := p.destroy(context.WithoutCancel(ctx), u.Info.ID, Ready); err == nil {
			p.log.Error("destroyed a ready unit that stopped answering pings", "id", u.Info.ID)
			p.host.nudge()
		}
	})
}
