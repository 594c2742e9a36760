package gvisor

import (
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// TestGVisorGolden: what NewGVisor registers, and its outputs, per cloud and installer
// setting, are what testdata/<case>.json holds.
func TestGVisorGolden(t *testing.T) {
	nsAndPull := testInstaller()
	nsAndPull.Namespace = "fusebox-nodes"
	nsAndPull.ImagePullSecrets = []string{"regcred", "other"}
	for name, args := range map[string]*GVisorArgs{
		"aks":             {Cloud: components.AKS, ScheduleOnSandboxNodes: true, NodeInstaller: testInstaller()},
		"aks-ns-pull":     {Cloud: components.AKS, ScheduleOnSandboxNodes: true, NodeInstaller: nsAndPull},
		"eks":             {Cloud: components.EKS, ScheduleOnSandboxNodes: true, NodeInstaller: &NodeInstallerArgs{Image: testInstallerImage, VerifyOnly: true}},
		"eks-unscheduled": {Cloud: components.EKS, NodeInstaller: &NodeInstallerArgs{Image: testInstallerImage, VerifyOnly: true, ImagePullSecrets: []string{"regcred"}}},
		"gke":             {Cloud: components.GKE},
		"local":           {Cloud: components.Local},
		"local-scheduled": {Cloud: components.Local, ScheduleOnSandboxNodes: true},
	} {
		t.Run(name, func(t *testing.T) {
			outputs := map[string]string{}
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				g, err := NewGVisor(ctx, "fb", args)
				if err != nil {
					return err
				}
				for k, o := range map[string]pulumi.StringOutput{
					"runtimeClassName": g.RuntimeClassName, "runtimeClassSource": g.RuntimeClassSource, "nodeInstaller": g.NodeInstaller,
				} {
					if outputs[k], err = mocktest.Await[string](ctx, o); err != nil {
						return err
					}
				}
				return nil
			})
			m.Golden(t, filepath.Join("testdata", name+".json"))
			mocktest.GoldenJSON(t, filepath.Join("testdata", name+".outputs.json"), outputs)
		})
	}
}
