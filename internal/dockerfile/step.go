package dockerfile

import (
	"fmt"
	"strconv"
	"strings"
)

// Step is one instruction after substitution, with the state it leaves (working directory,
// user, environment), so that a builder needs nothing else to run it.
type Step struct {
	// Line is where the instruction starts.
	Line int
	// Kind is the instruction.
	Kind Kind

	// Shell is a RUN command in shell form, run as /bin/sh -c Shell, unchanged (the shell
	// substitutes its variables).
	Shell string
	// Argv is a RUN command in exec form (JSON array), run without a shell.
	Argv []string

	// Sources are COPY and ADD sources: cleaned paths relative to the build context, which
	// may be path.Match patterns.
	Sources []string
	// Dest is the COPY or ADD destination: absolute (a relative one is resolved against the
	// working directory), and ending in / when it names a directory to copy into.
	Dest string
	// Chown is the --chown value, USER[:GROUP] (names or numbers, resolved in the image);
	// empty means root, as in Docker.
	Chown string
	// Chmod is the --chmod mode; nil keeps the sources' modes.
	Chmod *uint32

	// Pairs are an ENV or LABEL step's names and values, in order.
	Pairs []KeyValue

	// Workdir is the absolute working directory after the step (a WORKDIR step's own).
	Workdir string
	// User is the user after the step (a USER step's own); empty means the base image's.
	User string
	// Env is what the Dockerfile's ENV steps have set so far (including this one), in the
	// order names were first set; the image's Env is the base image's with these set over
	// it.
	Env []KeyValue
	// Args are the values of the ARG instructions declared so far (and set), which RUN
	// steps see as environment variables (see Environ) but the image does not keep.
	Args []KeyValue
}

// Key is a canonical, deterministic encoding of what the step does, for the build cache: a
// builder chains it with its parent's identity (and, for COPY and ADD, the digest of the
// sources' content). For the first step that identity should be the base image's config
// digest rather than its last layer's, since the config holds the Env, WorkingDir and User
// that steps inherit and Key leaves to the base. The line is not part of the key. RUN's key holds the command and what it
// runs with (working directory, user, ENV and ARG values); COPY's and ADD's the sources,
// destination, owner and mode; the others' their values (WORKDIR's also the user, who may
// own the directory the builder creates). Every string is quoted, so distinct steps never
// share a key.
func (s Step) Key() string {
	var b strings.Builder
	b.WriteString("fusebox-dockerfile-step/v1 ")
	b.WriteString(string(s.Kind))
	field := func(name string, vals ...string) {
		b.WriteString("\n" + name + " " + strconv.Itoa(len(vals)))
		for _, v := range vals {
			b.WriteString(" " + strconv.Quote(v))
		}
	}
	pairs := func(name string, kvs []KeyValue) {
		vals := make([]string, 0, 2*len(kvs))
		for _, kv := range kvs {
			vals = append(vals, kv.Key, kv.Value)
		}
		field(name, vals...)
	}
	switch s.Kind {
	case KindRun:
		if s.Argv != nil {
			field("argv", s.Argv...)
		} else {
			field("shell", s.Shell)
		}
		field("workdir", s.Workdir)
		field("user", s.User)
		pairs("env", s.Env)
		pairs("args", s.Args)
	case KindCopy, KindAdd:
		field("sources", s.Sources...)
		field("dest", s.Dest)
		field("chown", s.Chown)
		if s.Chmod != nil {
			field("chmod", fmt.Sprintf("%04o", *s.Chmod))
		} else {
			field("chmod")
		}
	case KindEnv, KindLabel:
		pairs("pairs", s.Pairs)
	case KindWorkdir:
		field("workdir", s.Workdir)
		field("user", s.User)
	case KindUser:
		field("user", s.User)
	}
	return b.String()
}

// Environ returns the environment a RUN step runs with, as KEY=VALUE strings, built as
// Docker does: the base image's Env (base), then s.Env set over it, then the ARG values of
// s.Args whose names neither sets.
func (s Step) Environ(base []string) []string {
	var v vars
	for _, kv := range base {
		k, val, _ := strings.Cut(kv, "=")
		v.set(k, val)
	}
	for _, kv := range s.Env {
		v.set(kv.Key, kv.Value)
	}
	for _, kv := range s.Args {
		if _, ok := v.get(kv.Key); !ok {
			v.set(kv.Key, kv.Value)
		}
	}
	out := make([]string, 0, len(v.kv))
	for _, kv := range v.kv {
		out = append(out, kv.Key+"="+kv.Value)
	}
	return out
}
