package manager

import (
	"context"
	"time"
)

// pingFailures is how many pings in a row a ready unit may miss before it is destroyed.
const pingFailures = 3

// pingHead pings the unit the next allocation will take (the oldest ready one of the pool
// template) every PingInterval, until ctx ends or stop closes: a liveness check, so that a
// unit whose sandbox died in the pool is destroyed (after pingFailures misses in a row,
// counted as a "ping" failure) and replaced, instead of failing an allocation first. Pinging
// more often does not make the unit faster to allocate (docs/performance.md), and a ping that
// meets an allocation delays it.
func (p *warmPool) pingHead(ctx context.Context, stop <-chan struct{}) {
	t := p.o.Clock.NewTicker(p.o.PingInterval)
	defer t.Stop()
	var missedID string
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C():
		}
		ids := p.ops.OldestReady(p.o.PoolTemplate, 1)
		if len(ids) == 0 {
			continue
		}
		u, ok := p.ops.Get(ids[0])
		if !ok || u.State != Ready {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, max(p.o.PingInterval, time.Second))
		err := p.o.Conns.Ping(pctx, u.Info.InitAddr)
		cancel()
		if err == nil || ctx.Err() != nil {
			missedID, missed = "", 0
			continue
		}
		if u.Info.ID != missedID {
			missedID, missed = u.Info.ID, 0
		}
		missed++
		p.log.Warn("ready unit missed a ping", "id", u.Info.ID, "missed", missed, "err", err)
		if missed < pingFailures {
			continue
		}
		missedID, missed = "", 0
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
}
