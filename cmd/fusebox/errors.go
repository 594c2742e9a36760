package main

import (
	"errors"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcError is what a gRPC call's error wraps.
type grpcError interface {
	error
	GRPCStatus() *status.Status
}

// describe is err's message for a person: a gRPC error's "rpc error: code = X desc = Y" is
// written as the code in words and the server's message ("permission denied: ...").
func describe(err error) string {
	msg := err.Error()
	var ge grpcError
	if !errors.As(err, &ge) {
		return msg
	}
	st := ge.GRPCStatus()
	words := codeWords(st.Code())
	text := st.Message()
	// gRPC's transport errors quote the cause: connection error: desc = "transport: ...".
	if q, ok := strings.CutPrefix(text, "connection error: desc = "); ok {
		if u, err := strconv.Unquote(q); err == nil {
			text = u
		}
	}
	if !strings.HasPrefix(strings.ToLower(text), words) {
		text = words + ": " + text
	}
	return strings.Replace(msg, ge.Error(), text, 1)
}

// codeWords is a gRPC code in lower-case words: PermissionDenied is "permission denied".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte(' ')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// nothingAnswered reports whether err is a call that reached no server (no socket, a refused
// or failed connection, a failed TLS handshake), rather than one the server answered with an
// error: only then is it worth asking whether the manager runs.
func nothingAnswered(err error) bool {
	var ge grpcError
	if !errors.As(err, &ge) {
		return false
	}
	st := ge.GRPCStatus()
	if st.Code() != codes.Unavailable {
		return false
	}
	// gRPC's own transport errors; a server's Unavailable (the manager's allocator failed)
	// carries the server's message instead.
	m := strings.ToLower(st.Message())
	for _, s := range []string{"connection error", "error while dialing", "connection refused", "no such file or directory", "connection closed before server preface"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// missingDashes is an unknown-flag error of fusebox run: most likely the command to run was
// given without -- before it, so that its flags were taken for fusebox run's.
type missingDashes struct {
	err error
	cmd *cobra.Command
}

func (e missingDashes) Error() string { return e.err.Error() }
func (e missingDashes) Unwrap() error { return e.err }

// hint says how to write args (the whole command line) with the command after --: fusebox
// run's own flags first, then -- and the rest.
func (e missingDashes) hint(args []string) string {
	i := 0
	for i < len(args) && args[i] != e.cmd.Name() {
		i++
	}
	if i == len(args) {
		return "put the command to run after --: fusebox run [flags] -- CMD [ARG...]"
	}
	flags, rest := []string{}, args[i+1:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "-") && rest[0] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(rest[0], "-"), "=")
		f := e.cmd.Flags().Lookup(name)
		if !strings.HasPrefix(rest[0], "--") {
			f = nil
			if len(name) == 1 { // ShorthandLookup panics on longer names
				f = e.cmd.Flags().ShorthandLookup(name)
			}
		}
		if f == nil {
			break
		}
		n := 1
		if f.NoOptDefVal == "" && !hasValue && len(rest) > 1 {
			n = 2 // the flag's value
		}
		flags, rest = append(flags, rest[:n]...), rest[n:]
	}
	return "put the command to run after --: " + strings.Join(append(append([]string{"fusebox", e.cmd.Name()}, flags...), append([]string{"--"}, rest...)...), " ")
}
