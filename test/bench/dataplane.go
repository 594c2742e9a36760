// Package bench is fusebox's benchmark harness: it drives real sandboxes under the pinned
// gVisor and reports figures as JSON for fusebox-bench.
package bench

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/test/bench/floor"
)

// DataplaneOptions configure the data-plane benchmark.
type DataplaneOptions struct {
	Runsc         string // path of the pinned runsc
	SandboxBinary string // path of a static fusebox-sandbox
	FloorBinary   string // path of a static fusebox-floor (the in-sandbox floor); required
	ExecRuns      int    // round trips of `true` (at least 500 for the published figure)
	BaselineRuns  int    // `runsc exec true` runs
	ShellFiles    int    // files timed for the shell-per-file baseline (scaled to 3,000)
	StreamMiB     int    // size of the streamed file
	// Tuned are the client options of the "tuned" figures (zero: DefaultTuned); the main
	// figures always use the client's defaults.
	Tuned client.Options
	Log   *slog.Logger
}

// Figure is one measured workload, described with what it measured: a published figure must
// be what a user's client sees, so each says its file count, sizes, directories, data,
// whether every byte read back was compared, and the client options.
type Figure struct {
	Files     int    `json:"files"`
	FileBytes int64  `json:"file_bytes"`
	Dirs      int    `json:"dirs"`
	Data      string `json:"data"`     // "random": incompressible, distinct per file (floor.Content)
	Verified  bool   `json:"verified"` // every byte read back was compared with what was written
	// Client is "defaults" (client.Dial with no Options, what an SDK user gets),
	// "tuned: ..." with the options, or "none" for an in-sandbox floor.
	Client  string  `json:"client"`
	Rounds  int     `json:"rounds"`              // the figure is the median of this many
	Seconds float64 `json:"seconds,omitempty"`   // median time of one round
	MiBPerS float64 `json:"mib_per_s,omitempty"` // median throughput of one round
	RPCs    int     `json:"rpcs,omitempty"`      // RPCs one round took
}

// DataplaneResult is the JSON `fusebox-bench dataplane --json` prints.
type DataplaneResult struct {
	ExecRuns                int     `json:"exec_runs"`
	ExecClient              string  `json:"exec_client"`
	ExecRoundtripP50Ms      float64 `json:"exec_roundtrip_p50_ms"`
	ExecRoundtripP99Ms      float64 `json:"exec_roundtrip_p99_ms"`
	ExecProcessP50Ms        float64 `json:"exec_process_p50_ms"`
	ExecOverheadP50Ms       float64 `json:"exec_overhead_p50_ms"`
	ExecOverheadP99Ms       float64 `json:"exec_overhead_p99_ms"`
	RunscExecRoundtripP50Ms float64 `json:"runsc_exec_roundtrip_p50_ms"`
	RoundtripSpeedupVsRunsc float64 `json:"roundtrip_speedup_vs_runsc_exec"`
	// Materialize is WriteFiles of the small-file workload; MaterializeFloor the same files
	// written by a plain loop inside the sandbox (fusebox-floor).
	Materialize        Figure  `json:"materialize"`
	MaterializeFloor   Figure  `json:"materialize_floor"`
	MaterializeVsFloor float64 `json:"materialize_vs_floor"`
	// MaterializeTuned is the same workload with DataplaneOptions.Tuned.
	MaterializeTuned        Figure  `json:"materialize_tuned"`
	ShellPerFile3000x4kS    float64 `json:"shell_per_file_3000x4k_seconds"`
	ShellPerFileTimedFiles  int     `json:"shell_per_file_timed_files"`
	ShellPerFileScaled      bool    `json:"shell_per_file_scaled_to_3000"`
	MaterializeSpeedupShell float64 `json:"materialize_speedup_vs_shell_per_file"`
	// Read is ReadFiles of a materialised tree, every byte compared; ReadFloor a plain
	// read-and-compare loop over the floor's tree inside the sandbox.
	Read        Figure  `json:"read"`
	ReadFloor   Figure  `json:"read_floor"`
	ReadVsFloor float64 `json:"read_vs_floor"`
	ReadTuned   Figure  `json:"read_tuned"`
	// StreamWrite is WriteFileFrom of one large random file held in memory; StreamRead is
	// ReadFileTo of it, compared as it arrives; both with the client's defaults (bulk
	// connections).
	StreamWrite Figure `json:"stream_write"`
	StreamRead  Figure `json:"stream_read"`
	// StreamFloorIn and StreamFloorOut are the streaming floor: the same bytes over a raw host
	// unix socket into and out of the sandbox (fusebox-floor -receive, -send), no TLS, HTTP/2
	// or file; the ratios are the streams' throughput over the floor's.
	StreamFloorIn      Figure  `json:"stream_floor_in"`
	StreamFloorOut     Figure  `json:"stream_floor_out"`
	StreamWriteVsFloor float64 `json:"stream_write_vs_floor"`
	StreamReadVsFloor  float64 `json:"stream_read_vs_floor"`
	// StreamFloorInFile and StreamFloorOutFile are that floor with the file: the helper writes
	// what it receives to a workspace file in the same loop, and sends that file back. Any
	// transfer that lands in a file does both.
	StreamFloorInFile      Figure  `json:"stream_floor_in_file"`
	StreamFloorOutFile     Figure  `json:"stream_floor_out_file"`
	StreamWriteVsFileFloor float64 `json:"stream_write_vs_file_floor"`
	StreamReadVsFileFloor  float64 `json:"stream_read_vs_file_floor"`
	// StreamFloorOutTLS is the file floor out under the data plane's pinned TLS 1.3 and
	// nothing else (fusebox-floor -send-tls: the helper is the TLS server, as the sandbox
	// server is, the host the pinned client; records gathered into one write per read of the
	// file, no fusebox framing), the host comparing every byte; StreamReadVsTLSFloor is the
	// stream out over it. TLSFloorVsFileFloor is that floor against the raw socket's from the
	// same file: the most any pinned TLS stream out can reach of the raw one.
	StreamFloorOutTLS    Figure  `json:"stream_floor_out_tls"`
	StreamReadVsTLSFloor float64 `json:"stream_read_vs_tls_floor"`
	TLSFloorVsFileFloor  float64 `json:"tls_floor_vs_file_floor"`
	// StreamWriteGRPC and StreamReadGRPC are the streams with client.Options{NoBulk: true}:
	// WriteFileStream and ReadFileStream over the gRPC connection instead of bulk connections.
	StreamWriteGRPC Figure `json:"stream_write_grpc"`
	StreamReadGRPC  Figure `json:"stream_read_grpc"`
	RunscVersion    string `json:"runsc"`
	Platform        string `json:"platform"`
}

// floorDir is where the floor helper's directory is bound in the benchmark's sandbox, and
// floorSockDir where the host directory holding the streaming floor's socket is.
const (
	floorDir     = "/opt/fusebox-floor"
	floorSockDir = "/opt/fusebox-floor-sock"
)

const (
	nFiles   = 3000
	fileSize = 4096
	rounds   = 5 // materialisation rounds; the median is reported
)

// DefaultTuned are the tuned figures' client options when DataplaneOptions.Tuned is zero: more
// batches in flight than the default 4.
var DefaultTuned = client.Options{Concurrency: 8}

// Dataplane starts one sandbox, binds it through sFuse and measures the data plane.
func Dataplane(ctx context.Context, o DataplaneOptions) (*DataplaneResult, error) {
	if o.ExecRuns <= 0 {
		o.ExecRuns = 500
	}
	if o.BaselineRuns <= 0 {
		o.BaselineRuns = 50
	}
	if o.ShellFiles <= 0 {
		o.ShellFiles = 300
	}
	if o.StreamMiB <= 0 {
		o.StreamMiB = 256
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Tuned == (client.Options{}) {
		o.Tuned = DefaultTuned
	}
	if o.FloorBinary == "" {
		return nil, fmt.Errorf("dataplane benchmark: FloorBinary (a static fusebox-floor) is required")
	}
	floorBin, err := filepath.Abs(o.FloorBinary)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fusebox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rt := &runsc.Runtime{Binary: o.Runsc, Root: filepath.Join(dir, "runsc-root")}
	defer rt.ReleaseRoot()
	etc := filepath.Join(dir, "etc")
	if err := runsc.WriteSanitizedEtc(etc); err != nil {
		return nil, fmt.Errorf("sanitised /etc: %w", err)
	}
	sockDir := filepath.Join(dir, "floorsock")
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		return nil, err
	}
	o.Log.Info("starting sandbox under gVisor", "runsc", o.Runsc)
	sb, err := localsandbox.Start(ctx, localsandbox.Options{
		Runtime: rt, ID: runsc.ID("bench", 1), Dir: filepath.Join(dir, "sandbox"),
		SandboxBinary: o.SandboxBinary,
		Bundle: runsc.BundleSpec{EtcDir: etc, MemoryLimitBytes: 4 << 30,
			// The floor helper's directory, read-only: the product sandbox binary has no floor.
			Mounts: []runsc.Mount{{Source: filepath.Dir(floorBin), Destination: floorDir, ReadOnly: true},
				{Source: sockDir, Destination: floorSockDir, ReadOnly: true}}},
	})
	if err != nil {
		return nil, err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	key, err := client.NewKey()
	if err != nil {
		return nil, err
	}
	pub, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(sb.DataAddr, pub.SandboxKey, key)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	tuned, err := client.Dial(sb.DataAddr, pub.SandboxKey, key, o.Tuned)
	if err != nil {
		return nil, err
	}
	defer tuned.Close()

	r := &DataplaneResult{ExecRuns: o.ExecRuns, ExecClient: "defaults", Platform: "systrap", RunscVersion: o.Runsc}

	// Exec round trips of `true`.
	o.Log.Info("exec round trips", "runs", o.ExecRuns)
	rtts, procs, over, err := execRoundTrips(ctx, c, o.ExecRuns)
	if err != nil {
		return nil, err
	}
	r.ExecRoundtripP50Ms, r.ExecRoundtripP99Ms = pct(rtts, 50), pct(rtts, 99)
	r.ExecProcessP50Ms = pct(procs, 50)
	r.ExecOverheadP50Ms, r.ExecOverheadP99Ms = pct(over, 50), pct(over, 99)

	o.Log.Info("runsc exec baseline", "runs", o.BaselineRuns)
	var base []float64
	for range o.BaselineRuns {
		t0 := time.Now()
		code, err := rt.Exec(ctx, sb.ID, []string{"/bin/true"}, io.Discard, io.Discard)
		if err != nil || code != 0 {
			return nil, fmt.Errorf("runsc exec true: code %d: %v", code, err)
		}
		base = append(base, ms(time.Since(t0)))
	}
	r.RunscExecRoundtripP50Ms = pct(base, 50)
	r.RoundtripSpeedupVsRunsc = round(r.RunscExecRoundtripP50Ms / r.ExecRoundtripP50Ms)

	// The small-file workload: 3,000 files of 4 KiB of random bytes in 50 directories.
	data := floor.Contents(nFiles, fileSize)
	tunedDesc := fmt.Sprintf("tuned: concurrency %d, batch bytes %d", o.Tuned.Concurrency, o.Tuned.BatchBytes)
	if o.Tuned.BatchBytes == 0 {
		tunedDesc = fmt.Sprintf("tuned: concurrency %d", o.Tuned.Concurrency)
	}
	// Default and tuned clients alternate round by round, so that the machine's load falls
	// on both alike.
	o.Log.Info("materialising and reading back 3000 x 4 KiB", "rounds", rounds)
	def, tun := newSmallRuns("defaults"), newSmallRuns(tunedDesc)
	for i := range rounds {
		if err := def.round(ctx, c, fmt.Sprintf("mat%d", i), data); err != nil {
			return nil, err
		}
		if err := tun.round(ctx, tuned, fmt.Sprintf("tuned%d", i), data); err != nil {
			return nil, err
		}
	}
	r.Materialize, r.Read = def.figures()
	r.MaterializeTuned, r.ReadTuned = tun.figures()

	o.Log.Info("in-sandbox floors", "rounds", rounds)
	floorRun := func(args ...string) (float64, error) {
		args = append(args, "-files", strconv.Itoa(nFiles), "-size", strconv.Itoa(fileSize))
		res, err := c.Run(ctx, append([]string{floorDir + "/" + filepath.Base(floorBin)}, args...)...)
		if err != nil {
			return 0, fmt.Errorf("floor program: %w", err)
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("floor program exited %d: %s", res.ExitCode, res.Stderr)
		}
		s, err := strconv.ParseFloat(strings.TrimSpace(string(res.Stdout)), 64)
		if err != nil {
			return 0, fmt.Errorf("floor program printed %q", res.Stdout)
		}
		return s, nil
	}
	var floors, readFloors []float64
	for i := range rounds {
		d := fmt.Sprintf("%s/floor%d", localsandbox.WorkspaceDir, i)
		s, err := floorRun("-dir", d)
		if err != nil {
			return nil, err
		}
		floors = append(floors, s)
		if s, err = floorRun("-read", "-dir", d); err != nil {
			return nil, err
		}
		readFloors = append(readFloors, s)
	}
	r.MaterializeFloor, r.ReadFloor = smallFigure("none"), smallFigure("none")
	r.ReadFloor.Verified = true
	r.MaterializeFloor.Seconds, r.ReadFloor.Seconds = pct(floors, 50), pct(readFloors, 50)
	r.MaterializeVsFloor = round(r.Materialize.Seconds / r.MaterializeFloor.Seconds)
	r.ReadVsFloor = round(r.Read.Seconds / r.ReadFloor.Seconds)

	o.Log.Info("shell-per-file baseline", "files", o.ShellFiles)
	if _, err := c.Run(ctx, "mkdir", "-p", "shell/d"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for i := range o.ShellFiles {
		res, err := c.Exec(ctx, client.Command{Argv: []string{"sh", "-c", fmt.Sprintf("cat > shell/d/f%05d.txt", i)}, Stdin: data[i%nFiles]})
		if err != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("shell write: %v", err)
		}
	}
	per := time.Since(t0).Seconds() / float64(o.ShellFiles)
	r.ShellPerFile3000x4kS = round(per * nFiles)
	r.ShellPerFileTimedFiles = o.ShellFiles
	r.ShellPerFileScaled = o.ShellFiles != nFiles
	r.MaterializeSpeedupShell = round(r.ShellPerFile3000x4kS / r.Materialize.Seconds)

	// One large file of random bytes, held in memory so that only the transfer is timed;
	// read back into a writer that compares each byte as it arrives.
	grpcStreams, err := client.Dial(sb.DataAddr, pub.SandboxKey, key, client.Options{NoBulk: true})
	if err != nil {
		return nil, err
	}
	defer grpcStreams.Close()
	if err := streams(ctx, r, c, grpcStreams, floorDir+"/"+filepath.Base(floorBin), sockDir, o); err != nil {
		return nil, err
	}
	return r, nil
}

// streamRounds is how many rounds the streams and their floors take; each figure is the median.
const streamRounds = 5

// streams measures one large file of random bytes (held in memory, so that only the transfer
// is timed) streamed in and out, read back into a writer that compares each byte as it
// arrives: with the client's defaults (bulk connections) and through the gRPC streams, and
// the floors, raw, with the file and with the file under TLS, interleaved round by round.
func streams(ctx context.Context, r *DataplaneResult, c, grpcStreams *client.Sandbox, helper, sockDir string, o DataplaneOptions) error {
	o.Log.Info("streaming one file in and out, and the streaming floors", "mib", o.StreamMiB, "rounds", streamRounds)
	size := int64(o.StreamMiB) << 20
	big := make([]byte, size)
	rand.NewChaCha8([32]byte{'f', 'u', 's', 'e'}).Read(big)
	fig := func(client string, verified bool) Figure {
		return Figure{Files: 1, FileBytes: size, Data: "random", Verified: verified, Client: client, Rounds: streamRounds, RPCs: 1}
	}
	r.StreamWrite, r.StreamRead = fig("defaults", false), fig("defaults", true)
	r.StreamWriteGRPC, r.StreamReadGRPC = fig("no bulk: gRPC streams", false), fig("no bulk: gRPC streams", true)
	var writes, reads, grpcWrites, grpcReads, floorIn, floorOut, fileIn, fileOut, tlsOut []float64
	hostKey, err := tlspin.GenerateKey()
	if err != nil {
		return err
	}
	mibs := func(d time.Duration) float64 { return float64(o.StreamMiB) / d.Seconds() }
	for i := range streamRounds {
		for _, arm := range []struct {
			sb          *client.Sandbox
			write, read *[]float64
		}{{c, &writes, &reads}, {grpcStreams, &grpcWrites, &grpcReads}} {
			name := fmt.Sprintf("big%d.bin", i)
			t0 := time.Now()
			n, err := arm.sb.WriteFileFrom(ctx, name, 0o644, bytes.NewReader(big), size)
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("streaming: %w", err)
			}
			if n != size {
				return fmt.Errorf("streamed %d bytes, want %d", n, size)
			}
			*arm.write = append(*arm.write, mibs(d))
			cmp := &comparer{want: big}
			t0 = time.Now()
			if err := arm.sb.ReadFileTo(ctx, name, cmp); err != nil {
				return fmt.Errorf("streaming %s back: %w", name, err)
			}
			d = time.Since(t0)
			if cmp.off != len(big) {
				return fmt.Errorf("streamed back %d bytes of %s, want %d", cmp.off, name, len(big))
			}
			*arm.read = append(*arm.read, mibs(d))
			if err := c.Remove(ctx, name, false); err != nil {
				return err
			}
		}
		in, out, err := streamFloor(ctx, c, helper, sockDir, big, "")
		if err != nil {
			return err
		}
		floorIn, floorOut = append(floorIn, in), append(floorOut, out)
		file := localsandbox.WorkspaceDir + "/floor-stream.bin"
		if in, out, err = streamFloor(ctx, c, helper, sockDir, big, file); err != nil {
			return err
		}
		fileIn, fileOut = append(fileIn, in), append(fileOut, out)
		if out, err = streamFloorTLS(ctx, c, helper, sockDir, big, file, hostKey); err != nil {
			return err
		}
		tlsOut = append(tlsOut, out)
		if err := c.Remove(ctx, file, false); err != nil {
			return err
		}
	}
	r.StreamWrite.MiBPerS, r.StreamRead.MiBPerS = round(pct(writes, 50)), round(pct(reads, 50))
	r.StreamWriteGRPC.MiBPerS, r.StreamReadGRPC.MiBPerS = round(pct(grpcWrites, 50)), round(pct(grpcReads, 50))
	floorFig := func(v []float64) Figure {
		f := fig("none", false)
		f.RPCs, f.MiBPerS = 0, round(pct(v, 50))
		return f
	}
	r.StreamFloorIn, r.StreamFloorOut = floorFig(floorIn), floorFig(floorOut)
	r.StreamFloorInFile, r.StreamFloorOutFile = floorFig(fileIn), floorFig(fileOut)
	r.StreamWriteVsFloor = round(r.StreamWrite.MiBPerS / r.StreamFloorIn.MiBPerS)
	r.StreamReadVsFloor = round(r.StreamRead.MiBPerS / r.StreamFloorOut.MiBPerS)
	r.StreamWriteVsFileFloor = round(r.StreamWrite.MiBPerS / r.StreamFloorInFile.MiBPerS)
	r.StreamReadVsFileFloor = round(r.StreamRead.MiBPerS / r.StreamFloorOutFile.MiBPerS)
	r.StreamFloorOutTLS = floorFig(tlsOut)
	r.StreamFloorOutTLS.Verified = true
	r.StreamReadVsTLSFloor = round(r.StreamRead.MiBPerS / r.StreamFloorOutTLS.MiBPerS)
	r.TLSFloorVsFileFloor = round(r.StreamFloorOutTLS.MiBPerS / r.StreamFloorOutFile.MiBPerS)
	return nil
}

// streamFloorTLS measures the TLS floor out of the sandbox: the floor helper sends file (left
// in the sandbox by streamFloor, holding data) to the host under pinned TLS 1.3 with the host
// pinned by hostKey (fusebox-floor -send-tls), and the host compares every byte. It returns
// the MiB/s the helper timed, from the end of the handshake until the host had every byte.
func streamFloorTLS(ctx context.Context, c *client.Sandbox, helper, sockDir string, data []byte, file string, hostKey crypto.Signer) (float64, error) {
	pub, err := tlspin.MarshalPublicKey(hostKey.Public())
	if err != nil {
		return 0, err
	}
	path := filepath.Join(sockDir, "floor.sock")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return 0, fmt.Errorf("TLS floor: %w", err)
	}
	defer ln.Close()
	if err := os.Chmod(path, 0o666); err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close()
		cmp := &comparer{want: data}
		n, err := floor.ReceiveStreamTLS(conn, hostKey, cmp)
		if err == nil && n != int64(len(data)) {
			err = fmt.Errorf("read %d bytes, want %d", n, len(data))
		}
		errc <- err
	}()
	res, err := c.Run(ctx, helper, "-send-tls", floorSockDir+"/floor.sock", "-pin", base64.StdEncoding.EncodeToString(pub), "-file", file)
	if err != nil || res.ExitCode != 0 {
		ln.Close() // ends the Accept, should the helper never have connected
		if err == nil {
			err = fmt.Errorf("exited %d: %s", res.ExitCode, res.Stderr)
		}
		return 0, fmt.Errorf("TLS floor: %w", err)
	}
	if err := <-errc; err != nil {
		return 0, fmt.Errorf("TLS floor, host side: %w", err)
	}
	var secs float64
	var n int64
	if _, err := fmt.Sscan(string(res.Stdout), &secs, &n); err != nil || n != int64(len(data)) {
		return 0, fmt.Errorf("TLS floor printed %q, want seconds and %d bytes", res.Stdout, len(data))
	}
	return float64(n) / (1 << 20) / secs, nil
}

// execRoundTrips runs `true` runs times over c, after 20 runs that warm the connection and the
// sandbox's caches, and returns each run's round trip, the process's own duration, and the
// difference (the data plane's overhead), in milliseconds.
func execRoundTrips(ctx context.Context, c *client.Sandbox, runs int) (rtts, procs, over []float64, err error) {
	for range 20 {
		if _, err := c.Run(ctx, "true"); err != nil {
			return nil, nil, nil, fmt.Errorf("warm-up exec: %w", err)
		}
	}
	for range runs {
		t0 := time.Now()
		res, err := c.Run(ctx, "true")
		rtt := time.Since(t0)
		if err != nil {
			return nil, nil, nil, err
		}
		if res.ExitCode != 0 {
			return nil, nil, nil, fmt.Errorf("true exited %d", res.ExitCode)
		}
		rtts = append(rtts, ms(rtt))
		procs = append(procs, ms(res.Duration))
		over = append(over, ms(rtt-res.Duration))
	}
	return rtts, procs, over, nil
}

// smallFigure describes the small-file workload (3,000 files of 4 KiB of random bytes in
// floor.Dirs directories, the median of rounds) as measured with client.
func smallFigure(client string) Figure {
	return Figure{Files: nFiles, FileBytes: fileSize, Dirs: floor.Dirs, Data: "random", Client: client, Rounds: rounds}
}

// smallRuns collects the rounds of the small-file workload with one client.
type smallRuns struct {
	mat, read   Figure
	mats, reads []float64
}

func newSmallRuns(client string) *smallRuns {
	r := &smallRuns{mat: smallFigure(client), read: smallFigure(client)}
	r.read.Verified = true
	return r
}

// round materialises data under root with sbx and reads it back, compared.
func (r *smallRuns) round(ctx context.Context, sbx *client.Sandbox, root string, data [][]byte) error {
	s, n, err := materialize(ctx, sbx, root, data)
	if err != nil {
		return err
	}
	r.mats, r.mat.RPCs = append(r.mats, s), n
	if s, n, err = readBack(ctx, sbx, root, data); err != nil {
		return err
	}
	r.reads, r.read.RPCs = append(r.reads, s), n
	return nil
}

// figures returns the write and read-back figures, each the median of the rounds.
func (r *smallRuns) figures() (mat, read Figure) {
	r.mat.Seconds, r.read.Seconds = pct(r.mats, 50), pct(r.reads, 50)
	return r.mat, r.read
}

// materialize writes the small-file workload (floor.Path under root, data) with WriteFiles and
// returns the seconds it took and the RPCs it made.
func materialize(ctx context.Context, sbx *client.Sandbox, root string, data [][]byte) (float64, int, error) {
	files := make([]client.File, len(data))
	for i := range files {
		files[i] = client.File{Path: floor.Path(root, i), Data: data[i]}
	}
	t0 := time.Now()
	st, err := sbx.WriteFiles(ctx, files, nil, nil)
	d := time.Since(t0)
	if err != nil {
		return 0, 0, fmt.Errorf("materialising: %w", err)
	}
	if st.Files != len(data) {
		return 0, 0, fmt.Errorf("materialised %d files, want %d", st.Files, len(data))
	}
	return d.Seconds(), st.Batches + st.Streamed, nil
}

// readBack reads what materialize wrote under root through the read plan, compares every
// byte, and returns the seconds both took and the RPCs (the plan's included).
func readBack(ctx context.Context, sbx *client.Sandbox, root string, data [][]byte) (float64, int, error) {
	t0 := time.Now()
	got, st, err := sbx.ReadFiles(ctx, root+"/**")
	if err != nil {
		return 0, 0, err
	}
	if len(got) != len(data) {
		return 0, 0, fmt.Errorf("read %d files, want %d", len(got), len(data))
	}
	for i := range data {
		if !bytes.Equal(got[floor.Path(root, i)], data[i]) {
			return 0, 0, fmt.Errorf("read back %s: contents differ from what was written", floor.Path(root, i))
		}
	}
	return time.Since(t0).Seconds(), 1 + st.Batches + st.Streamed, nil
}

// streamFloor measures raw unix-socket throughput between this host and the sandbox, one
// round each way: the host listens in sockDir (bound at floorSockDir) and the floor helper,
// run in the sandbox as a command, connects and reads data to EOF, or writes as many bytes
// back. With file set the helper writes what it reads to that file in the sandbox, then sends
// that file back, which the host compares with data. It returns the MiB/s of each way, as the
// helper timed them.
func streamFloor(ctx context.Context, c *client.Sandbox, helper, sockDir string, data []byte, file string) (in, out float64, err error) {
	path := filepath.Join(sockDir, "floor.sock")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return 0, 0, fmt.Errorf("streaming floor: %w", err)
	}
	defer ln.Close()
	// The helper runs as the commands' user: it may connect, nothing else.
	if err := os.Chmod(path, 0o666); err != nil {
		return 0, 0, err
	}
	sandboxPath := floorSockDir + "/floor.sock"
	var fileArgs []string
	if file != "" {
		fileArgs = []string{"-file", file}
	}
	run := func(serve func(net.Conn) error, args ...string) (float64, error) {
		errc := make(chan error, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				errc <- err
				return
			}
			defer conn.Close()
			errc <- serve(conn)
		}()
		res, err := c.Run(ctx, append(append([]string{helper}, args...), fileArgs...)...)
		if err != nil {
			ln.Close() // ends the Accept, should the helper never have connected
			return 0, fmt.Errorf("streaming floor: %w", err)
		}
		if res.ExitCode != 0 {
			ln.Close()
			return 0, fmt.Errorf("streaming floor exited %d: %s", res.ExitCode, res.Stderr)
		}
		if err := <-errc; err != nil {
			return 0, fmt.Errorf("streaming floor, host side: %w", err)
		}
		var secs float64
		var n int64
		if _, err := fmt.Sscan(string(res.Stdout), &secs, &n); err != nil || n != int64(len(data)) {
			return 0, fmt.Errorf("streaming floor printed %q, want seconds and %d bytes", res.Stdout, len(data))
		}
		return float64(n) / (1 << 20) / secs, nil
	}
	if in, err = run(func(conn net.Conn) error {
		_, err := conn.Write(data)
		return err
	}, "-receive", sandboxPath); err != nil {
		return 0, 0, err
	}
	out, err = run(func(conn net.Conn) error {
		var w io.Writer = io.Discard
		cmp := &comparer{want: data}
		if file != "" {
			w = cmp // the file holds what was sent in
		}
		n, err := io.CopyBuffer(struct{ io.Writer }{w}, conn, make([]byte, 2<<20))
		if err != nil {
			return err
		}
		if n != int64(len(data)) {
			return fmt.Errorf("read %d bytes, want %d", n, len(data))
		}
		_, err = conn.Write([]byte{1})
		return err
	}, "-send", sandboxPath, "-bytes", strconv.Itoa(len(data)))
	return in, out, err
}

// comparer is a writer that checks what it is given against want, in order.
type comparer struct {
	want []byte
	off  int
}

func (c *comparer) Write(p []byte) (int, error) {
	if len(p) > len(c.want)-c.off || !bytes.Equal(p, c.want[c.off:c.off+len(p)]) {
		return 0, fmt.Errorf("contents differ from what was written, at or after byte %d", c.off)
	}
	c.off += len(p)
	return len(p), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// round rounds v to three decimals (a microsecond, for milliseconds), halves away from zero:
// differences between arms are negative as often as not.
func round(v float64) float64 { return math.Round(v*1000) / 1000 }

// pct returns the p-th percentile (nearest rank) of xs.
func pct(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return round(s[i])
}
