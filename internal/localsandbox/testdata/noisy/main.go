// Command noisy stands in for a sandbox server that writes without end to its standard error
// (tests of the host's bound on the server log). It takes the server's flags, writes
// -noise=N bytes of lines to standard error through os.Stderr (as the server's logger does),
// then a last line saying how many it wrote, then serves the init socket, writing nothing.
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

func main() {
	initAddr, noise := "", 0
	for _, a := range os.Args[1:] {
		if v, ok := strings.CutPrefix(a, "-init-listen=unix://"); ok {
			initAddr = v
		}
		if v, ok := strings.CutPrefix(a, "-noise="); ok {
			noise, _ = strconv.Atoi(v)
		}
	}
	line := `{"level":"WARN","msg":"egress relay: cannot reach the egress proxy","err":"dial unix /run/fusebox/egress.sock: connect: connection refused"}` + "\n"
	wrote := 0
	for wrote < noise {
		n, err := os.Stderr.WriteString(line)
		wrote += n
		if err != nil {
			break
		}
	}
	fmt.Fprintf(os.Stderr, "noise done: wrote %d bytes\n", wrote)
	ln, err := net.Listen("unix", initAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		c.Close()
	}
}
