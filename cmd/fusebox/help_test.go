package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"
)

// TestDeployCommandsHelp: the help of release, promote, preview, up and destroy (text, flags
// and their defaults) is what testdata/help-<command>.txt holds.
func TestDeployCommandsHelp(t *testing.T) {
	t.Setenv("FUSEBOX_PULUMI_TOOLS", "")
	cmds := append([]*cobra.Command{releaseCmd(), promoteCmd()}, deployCmds()...)
	for _, c := range cmds {
		t.Run(c.Name(), func(t *testing.T) {
			var b strings.Builder
			b.WriteString("Use: " + c.Use + "\nShort: " + c.Short + "\nLong:\n" + c.Long + "\nExample:\n" + c.Example + "\n")
			b.WriteString("Usage:\n" + c.UsageString())
			golden.File(t, filepath.Join("testdata", "help-"+c.Name()+".txt"), []byte(b.String()))
		})
	}
}
