// Command fusebox-floor is the benchmark's in-sandbox floor: fusebox-bench dataplane runs it
// inside its sandbox to time a plain loop of open, write, close, or with -read of open, read,
// compare, close over the tree a write left (package
// github.com/fusebox-dev/fusebox/test/bench/floor), and prints the seconds it took. It is a
// static binary (CGO_ENABLED=0), so that it runs on any root the sandbox has.
//
//	fusebox-floor -dir /workspace/floor0 -files 3000 -size 4096
//	fusebox-floor -read -dir /workspace/floor0 -files 3000 -size 4096
//	fusebox-floor -receive /opt/fusebox-floor-sock/floor.sock
//	fusebox-floor -send /opt/fusebox-floor-sock/floor.sock -bytes 268435456
//	fusebox-floor -receive /opt/fusebox-floor-sock/floor.sock -file /workspace/big
//	fusebox-floor -send-tls /opt/fusebox-floor-sock/floor.sock -pin BASE64-DER -file /workspace/big
//
// With -receive or -send it is the streaming floor instead: it connects to a host unix socket
// and reads until EOF, or writes -bytes, and prints the seconds that took and the bytes. With
// -file it writes what it receives to that file, or sends that file. With -send-tls it sends
// the -file under the data plane's pinned TLS 1.3 (floor.SendStreamTLS), pinning the host's
// key given by -pin.
package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"os"

	"github.com/fusebox-dev/fusebox/test/bench/floor"
)

func main() {
	dir := flag.String("dir", "", "directory to write into (created), or to read back with -read")
	n := flag.Int("files", 3000, "number of files")
	size := flag.Int("size", 4096, "bytes per file")
	read := flag.Bool("read", false, "read back and verify the files a write to -dir left, instead of writing")
	receive := flag.String("receive", "", "unix socket to read from until EOF (the streaming floor in)")
	send := flag.String("send", "", "unix socket to write -bytes to (the streaming floor out)")
	nbytes := flag.Int64("bytes", 256<<20, "bytes to write with -send")
	file := flag.String("file", "", "with -receive: write what arrives to this file; with -send or -send-tls: send this file")
	sendTLS := flag.String("send-tls", "", "unix socket to send -file to under pinned TLS 1.3 (the TLS floor out)")
	pin := flag.String("pin", "", "with -send-tls: the host's public key, base64 of its DER SubjectPublicKeyInfo")
	flag.Parse()
	switch {
	case *sendTLS != "":
		key, err := base64.StdEncoding.DecodeString(*pin)
		if err != nil || *file == "" {
			fmt.Fprintln(os.Stderr, "fusebox-floor: -send-tls needs -file and -pin (base64)")
			os.Exit(2)
		}
		n, d, err := floor.SendStreamTLS(*sendTLS, *file, key)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fusebox-floor:", err)
			os.Exit(1)
		}
		fmt.Printf("%.6f %d\n", d.Seconds(), n)
		return
	case *receive != "":
		n, d, err := floor.ReceiveStream(*receive, *file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fusebox-floor:", err)
			os.Exit(1)
		}
		fmt.Printf("%.6f %d\n", d.Seconds(), n)
		return
	case *send != "":
		n, d, err := floor.SendStream(*send, *nbytes, *file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fusebox-floor:", err)
			os.Exit(1)
		}
		fmt.Printf("%.6f %d\n", d.Seconds(), n)
		return
	}
	if *dir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: fusebox-floor [-read] -dir DIR [-files N] [-size BYTES] | -receive SOCKET [-file F] | -send SOCKET [-bytes N | -file F] | -send-tls SOCKET -pin KEY -file F")
		os.Exit(2)
	}
	run := floor.WriteFiles
	if *read {
		run = floor.ReadFiles
	}
	d, err := run(*dir, *n, *size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fusebox-floor:", err)
		os.Exit(1)
	}
	fmt.Printf("%.6f\n", d.Seconds())
}
