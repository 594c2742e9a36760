package dataplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

func TestExecBasics(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := b.Client.Run(ctx, "uname", "-r")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("uname -r = %q, want gVisor's kernel", res.Stdout)
	}
	res, err = b.Client.Exec(ctx, client.Command{Script: "echo out; echo err >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("result %+v stdout %q stderr %q", res, res.Stdout, res.Stderr)
	}
}
