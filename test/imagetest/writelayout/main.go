// Command writelayout writes the test sandbox image of package imagetest as an OCI image
// layout, for benchmarks of the local runtime with an image root before `fusebox image
// build` is at hand:
//
//	go run ./test/imagetest/writelayout -out /tmp/images/sandbox -sandbox-binary bin/fusebox-sandbox
//	sudo bin/fusebox local up --image /tmp/images/sandbox
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fusebox-dev/fusebox/test/imagetest"
)

func main() {
	out := flag.String("out", "", "layout directory to write (must not exist)")
	bin := flag.String("sandbox-binary", "bin/fusebox-sandbox", "static fusebox-sandbox to put at "+imagetest.Entrypoint)
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "writelayout: -out is required")
		os.Exit(2)
	}
	if _, err := os.Stat(*out); err == nil {
		fmt.Fprintf(os.Stderr, "writelayout: %s exists; remove it or pick another -out\n", *out)
		os.Exit(2)
	}
	h, err := imagetest.WriteLayout(*out, *bin, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "writelayout:", err)
		os.Exit(1)
	}
	fmt.Printf("sandbox %s %s\n", *out, h)
}
