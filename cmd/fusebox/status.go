package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// unitStates are the state names the manager counts units by, in a unit's order of life.
var unitStates = []string{"ready", "creating", "initialising", "bound", "destroying", "failed"}

func statusCmd() *cobra.Command {
	var mgr managerFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the warm pool and the sandboxes the manager holds",
		Long: `Shows the pool's counts and the sandboxes the caller allocated: a caller sees its own
sandboxes only (on the local socket, those of its user id; in a cluster, those of its
ServiceAccount). Root, the manager's own user and the policy's operators see every sandbox,
the warm pool included.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, closeConn, err := mgr.dial()
			if err != nil {
				return err
			}
			defer closeConn()
			ps, err := c.PoolStatus(cmd.Context(), &managerv1.PoolStatusRequest{})
			if err != nil {
				return mgr.explain(fmt.Errorf("asking %s: %w", mgr.addr, err))
			}
			list, err := c.List(cmd.Context(), &managerv1.ListRequest{})
			if err != nil {
				return err
			}
			var states []string
			for _, s := range unitStates {
				states = append(states, fmt.Sprintf("%s %d", s, ps.Units[s]))
			}
			fmt.Printf("allocator %s, estimator %s, target %d ready\n%s\n", ps.Allocator, ps.Estimator, ps.Target, strings.Join(states, ", "))
			fmt.Printf("allocations %d (%.2f/s over the last minute; %d waited for a cold start), creations %d, destructions %d, failures %d, provisioning %v\n\n",
				ps.Allocations, ps.DemandPerSecond, ps.ColdWaits, ps.Creations, ps.Destructions, ps.Failures, ps.ProvisioningLatency.AsDuration().Round(time.Millisecond))
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			if len(ps.Pools) > 0 {
				fmt.Fprintln(w, "TEMPLATE\tESTIMATOR\tTARGET\tREADY\tCREATING\tBOUND\tDEMAND/S\tPROVISIONING\tLAST FAILURE")
				for _, p := range ps.Pools {
					failure := "-"
					if p.LastError != "" {
						failure = strings.ReplaceAll(p.LastError, "\n", " ")
						if len(failure) > 120 {
							failure = failure[:117] + "..."
						}
						if p.LastErrorAt != nil {
							failure = time.Since(p.LastErrorAt.AsTime()).Round(time.Second).String() + " ago: " + failure
						}
					}
					fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%v\t%s\n", p.Template, p.Estimator, p.Target,
						p.Units["ready"], p.Units["creating"], p.Units["bound"], p.DemandPerSecond,
						p.ProvisioningLatency.AsDuration().Round(time.Millisecond), failure)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				fmt.Println()
			}
			fmt.Fprintln(w, "SANDBOX\tSTATE\tAGE\tLEASE LEFT\tEGRESS\tLABELS / ERROR")
			sbs := list.Sandboxes
			slices.SortFunc(sbs, func(a, b *managerv1.Sandbox) int { return strings.Compare(a.SandboxId, b.SandboxId) })
			for _, s := range sbs {
				age, left := "-", "-"
				if s.Created != nil {
					age = time.Since(s.Created.AsTime()).Round(time.Second).String()
				}
				if s.LeaseExpires != nil {
					left = time.Until(s.LeaseExpires.AsTime()).Round(time.Second).String()
				}
				egress := strings.Join(s.Egress, ",")
				if egress == "" {
					egress = "-"
				}
				extra := strings.ReplaceAll(s.Error, "\n", " ")
				if len(extra) > 120 {
					extra = extra[:117] + "..."
				}
				if extra == "" {
					var kv []string
					for k, v := range s.Labels {
						kv = append(kv, k+"="+v)
					}
					slices.Sort(kv)
					extra = strings.Join(kv, ",")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SandboxId,
					strings.ToLower(strings.TrimPrefix(s.State.String(), "UNIT_STATE_")), age, left, egress, extra)
			}
			return w.Flush()
		},
	}
	mgr.register(cmd.Flags())
	return cmd
}
