package dockerfile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func parse(t *testing.T, src string) *File {
	t.Helper()
	f, err := ParseBytes([]byte(src))
	if err != nil {
		t.Fatalf("parsing:\n%s\nerror: %v", src, err)
	}
	return f
}

func expand(t *testing.T, src string, o ExpandOptions) *Stage {
	t.Helper()
	st, err := parse(t, src).Expand(o)
	if err != nil {
		t.Fatalf("expanding:\n%s\nerror: %v", src, err)
	}
	return st
}

func mode(m uint32) *uint32 { return &m }

func env(kv ...string) []KeyValue {
	var out []KeyValue
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, KeyValue{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// checkError checks that err is an *Error at line wrapping sentinel, whose text holds want.
func checkError(t *testing.T, err error, line int, sentinel error, want string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	if e.Line != line {
		t.Errorf("error %q: line %d, want %d", err, e.Line, line)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("error %q does not wrap %v", err, sentinel)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
}

func TestRefusedInstructions(t *testing.T) {
	for _, word := range []string{"CMD", "ENTRYPOINT", "EXPOSE", "VOLUME", "ONBUILD", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "MAINTAINER"} {
		t.Run(word, func(t *testing.T) {
			src := "FROM alpine\n\n# a comment\nRUN true\n" + strings.ToLower(word) + " x y\nRUN true\n"
			_, err := ParseBytes([]byte(src))
			want := "Dockerfile:5: " + word + " is not supported (supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL)"
			if err == nil || err.Error() != want {
				t.Fatalf("error %v, want %q", err, want)
			}
			checkError(t, err, 5, ErrUnsupported, word)
		})
	}
	t.Run("unknown word", func(t *testing.T) {
		_, err := ParseBytes([]byte("FROM alpine\nFETCH x\n"))
		checkError(t, err, 2, ErrUnsupported, "FETCH is not a Dockerfile instruction (supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL)")
	})
	t.Run("exact message", func(t *testing.T) {
		src := "FROM a\nRUN 1\nRUN 2\nRUN 3\nRUN 4\nRUN 5\nEXPOSE 8080\n"
		_, err := ParseBytes([]byte(src))
		want := "Dockerfile:7: EXPOSE is not supported (supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL)"
		if err == nil || err.Error() != want {
			t.Fatalf("error %v, want %q", err, want)
		}
	})
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src      string
		line     int
		sentinel error
		want     string
	}{
		{"empty file", "", 0, ErrSyntax, "Dockerfile: no FROM instruction"},
		{"only comments", "# hello\n\n", 0, ErrSyntax, "no FROM instruction"},
		{"only ARG", "ARG A=1\n", 0, ErrSyntax, "no FROM instruction"},
		{"RUN before FROM", "ARG A\nRUN true\nFROM a\n", 2, ErrSyntax, "RUN before FROM"},
		{"second FROM", "FROM a\nRUN x\nFROM b\n", 3, ErrUnsupported, "multi-stage builds are not supported: a second FROM (the first is on line 1)"},
		{"FROM AS", "FROM a AS build\n", 1, ErrUnsupported, "named build stages are not supported"},
		{"FROM as lower-case", "from a as build\n", 1, ErrUnsupported, "named build stages"},
		{"FROM platform", "FROM --platform=linux/arm64 a\n", 1, ErrUnsupported, "FROM --platform is not supported"},
		{"FROM two words", "FROM a b\n", 1, ErrSyntax, "FROM takes exactly one image reference"},
		{"FROM nothing", "FROM\n", 1, ErrSyntax, "FROM requires an image reference"},
		{"COPY from", "FROM a\nCOPY --from=build /x /y\n", 2, ErrUnsupported, "COPY --from is not supported: multi-stage builds are not supported"},
		{"COPY link", "FROM a\nCOPY --link x /y\n", 2, ErrUnsupported, "COPY --link is not supported"},
		{"COPY parents", "FROM a\nCOPY --parents x /y/\n", 2, ErrUnsupported, "COPY --parents is not supported"},
		{"COPY exclude", "FROM a\nCOPY --exclude=*.pyc . /y/\n", 2, ErrUnsupported, "COPY --exclude is not supported"},
		{"ADD checksum", "FROM a\nADD --checksum=sha256:00 x /y\n", 2, ErrUnsupported, "ADD --checksum is not supported"},
		{"ADD keep-git-dir", "FROM a\nADD --keep-git-dir=true x /y\n", 2, ErrUnsupported, "ADD --keep-git-dir"},
		{"ADD http", "FROM a\nADD http://example.com/x.tgz /y\n", 2, ErrUnsupported, "ADD http://example.com/x.tgz: only local sources are supported"},
		{"ADD https", "FROM a\nADD https://example.com/x.tgz /y\n", 2, ErrUnsupported, "only local sources"},
		{"ADD HTTPS upper-case", "FROM a\nADD HTTPS://example.com/x.tgz /y\n", 2, ErrUnsupported, "only local sources"},
		{"ADD git ssh", "FROM a\nADD git@github.com:o/r.git /src\n", 2, ErrUnsupported, "only local sources"},
		{"ADD git scheme", "FROM a\nADD git://example.com/r.git /src\n", 2, ErrUnsupported, "only local sources"},
		{"ADD URL in JSON form", "FROM a\nADD [\"https://example.com/x\", \"/y\"]\n", 2, ErrUnsupported, "only local sources"},
		{"COPY URL", "FROM a\nCOPY https://example.com/x /y\n", 2, ErrSyntax, "a COPY source cannot be a URL"},
		{"RUN mount", "FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x\n", 2, ErrUnsupported, "RUN --mount is not supported"},
		{"RUN network", "FROM a\nRUN --network=host curl x\n", 2, ErrUnsupported, "RUN --network is not supported"},
		{"RUN security", "FROM a\nRUN --security=insecure x\n", 2, ErrUnsupported, "RUN --security is not supported"},
		{"RUN unknown flag", "FROM a\nRUN --frobnicate x\n", 2, ErrSyntax, "RUN: unknown flag --frobnicate"},
		{"ENV flag", "FROM a\nENV --x=1 A=1\n", 2, ErrSyntax, "ENV: unknown flag --x"},
		{"COPY unknown flag", "FROM a\nCOPY --owner=1 x /y\n", 2, ErrSyntax, "COPY: unknown flag --owner"},
		{"chown without value", "FROM a\nCOPY --chown x /y\n", 2, ErrSyntax, "COPY --chown needs a value: --chown=USER[:GROUP]"},
		{"chown empty", "FROM a\nCOPY --chown= x /y\n", 2, ErrSyntax, "--chown needs a value"},
		{"chown twice", "FROM a\nCOPY --chown=1 --chown=2 x /y\n", 2, ErrSyntax, "flag --chown given twice"},
		{"chmod not octal", "FROM a\nCOPY --chmod=u+x x /y\n", 2, ErrSyntax, "COPY --chmod=u+x: want an octal mode"},
		{"chmod digit 9", "FROM a\nCOPY --chmod=0789 x /y\n", 2, ErrSyntax, "want an octal mode"},
		{"chmod too big", "FROM a\nADD --chmod=17777 x /y\n", 2, ErrSyntax, "ADD --chmod=17777"},
		{"COPY one argument", "FROM a\nCOPY x\n", 2, ErrSyntax, "COPY requires at least one source and a destination"},
		{"COPY nothing", "FROM a\nCOPY\n", 2, ErrSyntax, "COPY requires at least one source"},
		{"COPY absolute source", "FROM a\nCOPY /etc/passwd /x\n", 2, ErrSyntax, "COPY /etc/passwd: a source must be relative to the build context"},
		{"COPY dot-dot source", "FROM a\nCOPY ../secret /x\n", 2, ErrSyntax, "COPY ../secret: a source must stay inside the build context"},
		{"COPY dot-dot after cleaning", "FROM a\nCOPY a/b/../../../secret /x\n", 2, ErrSyntax, "must stay inside the build context"},
		{"COPY dot-dot alone", "FROM a\nCOPY .. /x/\n", 2, ErrSyntax, "must stay inside"},
		{"COPY dot-dot JSON form", "FROM a\nCOPY [\"ok\", \"../x\", \"/d/\"]\n", 2, ErrSyntax, "must stay inside"},
		{"ADD dot-dot", "FROM a\nADD ./../x /x\n", 2, ErrSyntax, "ADD ./../x: a source must stay inside"},
		{"COPY bad pattern", "FROM a\nCOPY [a /x\n", 2, ErrSyntax, "bad pattern"},
		{"COPY empty source", "FROM a\nCOPY [\"\", \"/x\"]\n", 2, ErrSyntax, "empty source"},
		{"RUN heredoc", "FROM a\nRUN <<EOF\necho hi\nEOF\n", 2, ErrUnsupported, "RUN: heredocs (<<WORD) are not supported"},
		{"RUN heredoc quoted", "FROM a\nRUN python3 <<-'EOT'\nprint(1)\nEOT\n", 2, ErrUnsupported, "heredocs"},
		{"COPY heredoc", "FROM a\nCOPY <<EOF /x\nhi\nEOF\n", 2, ErrUnsupported, "COPY: heredocs"},
		{"RUN JSON not strings", "FROM a\nRUN [\"echo\", 1]\n", 2, ErrSyntax, "must hold only strings"},
		{"RUN JSON null", "FROM a\nRUN [\"echo\", null]\n", 2, ErrSyntax, "must hold only strings"},
		{"RUN empty JSON", "FROM a\nRUN []\n", 2, ErrSyntax, "RUN requires a command"},
		{"RUN nothing", "FROM a\nRUN\n", 2, ErrSyntax, "RUN requires a command"},
		{"RUN continuation to nothing", "FROM a\nRUN \\\n\n", 2, ErrSyntax, "RUN requires a command"},
		{"ENV nothing", "FROM a\nENV\n", 2, ErrSyntax, "ENV requires at least one NAME=VALUE"},
		{"ENV legacy without value", "FROM a\nENV A\n", 2, ErrSyntax, "ENV A has no value"},
		{"ENV word without =", "FROM a\nENV A=1 B\n", 2, ErrSyntax, `ENV: "B" is not NAME=VALUE`},
		{"ENV empty name", "FROM a\nENV =1\n", 2, ErrSyntax, "has an empty name"},
		{"LABEL word without =", "FROM a\nLABEL a=1 b\n", 2, ErrSyntax, `LABEL: "b" is not NAME=VALUE`},
		{"ARG empty name", "FROM a\nARG =1\n", 2, ErrSyntax, "ARG: \"=1\" has an empty name"},
		{"ARG nothing", "FROM a\nARG\n", 2, ErrSyntax, "ARG requires a NAME"},
		{"WORKDIR nothing", "FROM a\nWORKDIR\n", 2, ErrSyntax, "WORKDIR requires a path"},
		{"USER nothing", "FROM a\nUSER  \n", 2, ErrSyntax, "USER requires a user"},
		{"bad escape directive", "# escape=x\nFROM a\n", 1, ErrSyntax, "invalid escape character"},
		{"escape directive twice", "# escape=`\n# escape=\\\nFROM a\n", 2, ErrSyntax, "only one escape parser directive"},
		{"error on a continued line names the first line", "FROM a\nRUN true\nEXPOSE \\\n  80 \\\n  443\n", 3, ErrUnsupported, "Dockerfile:3: EXPOSE"},
		{"line count after continuations", "FROM a\nRUN a \\\n  b \\\n  c\nVOLUME /x\n", 5, ErrUnsupported, "Dockerfile:5: VOLUME"},
		{"instruction inside continuation comment is not one", "FROM a\nRUN a \\\n# EXPOSE 80\n  b\nCMD x\n", 5, ErrUnsupported, "Dockerfile:5: CMD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseBytes([]byte(tc.src))
			if err == nil {
				t.Fatalf("parsing %q: no error, want one with %q", tc.src, tc.want)
			}
			checkError(t, err, tc.line, tc.sentinel, tc.want)
		})
	}
}

func TestExpandErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src      string
		args     map[string]string
		line     int
		sentinel error
		want     string
	}{
		{"source leaves the context through a variable", "FROM a\nARG S=../../etc\nCOPY $S /x/\n", nil, 3, ErrSyntax, "COPY ../../etc: a source must stay inside the build context"},
		{"source leaves the context through a build arg", "FROM a\nARG S\nCOPY ${S}/passwd /x\n", map[string]string{"S": "/etc"}, 3, ErrSyntax, "must be relative"},
		{"ADD URL through a variable", "FROM a\nARG U=https://example.com/x\nADD $U /x\n", nil, 3, ErrUnsupported, "only local sources"},
		{"chmod through a variable", "FROM a\nARG M=999\nCOPY --chmod=$M x /y\n", nil, 3, ErrSyntax, "--chmod=999"},
		{"chown empty user", "FROM a\nARG G=1\nCOPY --chown=${U}:$G x /y\n", nil, 3, ErrSyntax, "--chown=:1: want USER or USER:GROUP"},
		{"empty FROM", "ARG BASE\nFROM $BASE\n", nil, 2, ErrSyntax, "FROM $BASE is empty once substituted"},
		{"empty WORKDIR", "FROM a\nWORKDIR $NOPE\n", nil, 2, ErrSyntax, "WORKDIR $NOPE is empty"},
		{"empty USER", "FROM a\nUSER ${NOPE}\n", nil, 2, ErrSyntax, "USER ${NOPE} is empty"},
		{"empty destination", "FROM a\nCOPY x $NOPE\n", nil, 2, ErrSyntax, "the destination $NOPE is empty"},
		{"several sources into a file", "FROM a\nCOPY a b /dst\n", nil, 2, ErrSyntax, "COPY with several sources needs a destination directory ending in /"},
		{"required variable", "ARG V\nFROM img:${V:?required}\n", nil, 2, ErrVariable, "V: required"},
		{"required variable with a message", "FROM a\nARG V\nENV X=\"${V:?pass --build-arg V}\"\n", nil, 3, ErrVariable, "V: pass --build-arg V"},
		{"required variable without message", "FROM a\nARG V=\nENV X=${V:?}\n", nil, 3, ErrVariable, "V: not set"},
		{"unsupported substitution", "FROM a\nENV X=${HOME%/}\n", nil, 2, ErrUnsupported, "unsupported substitution"},
		{"bad substitution", "FROM a\nLABEL x=${}\n", nil, 2, ErrSyntax, "bad substitution"},
		{"missing brace", "FROM a\nWORKDIR /x/${A\n", nil, 2, ErrSyntax, "missing '}'"},
		{"missing brace in default", "FROM a\nWORKDIR /x/${A:-b\n", nil, 2, ErrSyntax, "missing '}'"},
		{"unterminated double quote", "FROM a\nENV X=\"abc\n", nil, 2, ErrSyntax, "missing closing double quote"},
		{"unterminated single quote", "FROM a\nUSER 'abc\n", nil, 2, ErrSyntax, "missing closing single quote"},
		{"ENV name with = once substituted", "FROM a\nARG K=A=B\nENV $K=1\n", nil, 3, ErrSyntax, `ENV: the name "A=B" holds =`},
		{"ENV name empty once substituted", "FROM a\nENV $NOPE=1\n", nil, 2, ErrSyntax, "the name $NOPE is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := parse(t, tc.src)
			_, err := f.Expand(ExpandOptions{BuildArgs: tc.args})
			if err == nil {
				t.Fatalf("expanding %q: no error, want one with %q", tc.src, tc.want)
			}
			checkError(t, err, tc.line, tc.sentinel, tc.want)
		})
	}
}

func TestSteps(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		opts ExpandOptions
		from string
		want []Step
	}{
		{
			name: "RUN shell form is kept unchanged, variables included",
			src:  "FROM a\nENV X=1\nRUN echo \"$X\" ${Y:-z} 'q' \\$HOME\n",
			want: []Step{
				{Line: 2, Kind: KindEnv, Pairs: env("X", "1"), Workdir: "/", Env: env("X", "1")},
				{Line: 3, Kind: KindRun, Shell: `echo "$X" ${Y:-z} 'q' \$HOME`, Workdir: "/", Env: env("X", "1")},
			},
		},
		{
			name: "RUN exec form",
			src:  "FROM a\nRUN [\"/bin/echo\", \"a b\", \"$HOME\"]\n",
			want: []Step{{Line: 2, Kind: KindRun, Argv: []string{"/bin/echo", "a b", "$HOME"}, Workdir: "/"}},
		},
		{
			name: "RUN that only looks like JSON is shell form",
			src:  "FROM a\nRUN [ -f /etc/os-release ] && echo yes\n",
			want: []Step{{Line: 2, Kind: KindRun, Shell: "[ -f /etc/os-release ] && echo yes", Workdir: "/"}},
		},
		{
			name: "continuation lines, with comments and blank lines inside, join without separator",
			src: "FROM a\nRUN apt-get update && \\\n    apt-get install -y \\\n# a comment inside\n\n" +
				"      curl \\  \n  git\nRUN x\\\ny\n",
			want: []Step{
				{Line: 2, Kind: KindRun, Shell: "apt-get update &&     apt-get install -y       curl   git", Workdir: "/"},
				{Line: 8, Kind: KindRun, Shell: "xy", Workdir: "/"},
			},
		},
		{
			name: "an escaped escape at the end is not a continuation",
			src:  "FROM a\nRUN echo a\\\\\nRUN b\n",
			want: []Step{
				{Line: 2, Kind: KindRun, Shell: `echo a\\`, Workdir: "/"},
				{Line: 3, Kind: KindRun, Shell: "b", Workdir: "/"},
			},
		},
		{
			name: "case-insensitive words, leading blanks, CRLF, byte-order mark",
			src:  "\ufeff  from a\r\n\trun true\r\n   Workdir /srv\r\n",
			want: []Step{
				{Line: 2, Kind: KindRun, Shell: "true", Workdir: "/"},
				{Line: 3, Kind: KindWorkdir, Workdir: "/srv"},
			},
		},
		{
			name: "a # after the start of a line is not a comment",
			src:  "FROM a\nRUN echo a # b\n",
			want: []Step{{Line: 2, Kind: KindRun, Shell: "echo a # b", Workdir: "/"}},
		},
		{
			name: "escape directive: backtick continues lines and escapes, backslash is plain",
			src:  "# escape=`\n# syntax=docker/dockerfile:1\nFROM a\nRUN dir C:\\ `\n  && echo $X\nENV P=C:\\tools Q=`$R\n",
			want: []Step{
				{Line: 4, Kind: KindRun, Shell: `dir C:\   && echo $X`, Workdir: "/"},
				{Line: 6, Kind: KindEnv, Pairs: env("P", `C:\tools`, "Q", "$R"), Workdir: "/", Env: env("P", `C:\tools`, "Q", "$R")},
			},
		},
		{
			name: "a directive after a comment is a comment",
			src:  "# hello\n# escape=`\nFROM a\nRUN a `\nRUN b\n",
			want: []Step{
				{Line: 4, Kind: KindRun, Shell: "a `", Workdir: "/"},
				{Line: 5, Kind: KindRun, Shell: "b", Workdir: "/"},
			},
		},
		{
			name: "ENV pairs with quotes and escapes, several per line",
			src:  "FROM a\nENV A=1 B=\"two words\" C='$A single' D=three\\ words E=\"q\\\"uote\" F=\n",
			want: []Step{{Line: 2, Kind: KindEnv, Workdir: "/",
				Pairs: env("A", "1", "B", "two words", "C", "$A single", "D", "three words", "E", `q"uote`, "F", ""),
				Env:   env("A", "1", "B", "two words", "C", "$A single", "D", "three words", "E", `q"uote`, "F", "")}},
		},
		{
			name: "ENV legacy form: the value is the rest of the line",
			src:  "FROM a\nENV GREETING hello   big \"world\"\n",
			want: []Step{{Line: 2, Kind: KindEnv, Workdir: "/", Pairs: env("GREETING", "hello   big world"), Env: env("GREETING", "hello   big world")}},
		},
		{
			name: "ENV values see the variables as before the instruction",
			src:  "FROM a\nENV A=1\nENV A=2 B=$A\nENV C=$A\n",
			want: []Step{
				{Line: 2, Kind: KindEnv, Workdir: "/", Pairs: env("A", "1"), Env: env("A", "1")},
				{Line: 3, Kind: KindEnv, Workdir: "/", Pairs: env("A", "2", "B", "1"), Env: env("A", "2", "B", "1")},
				{Line: 4, Kind: KindEnv, Workdir: "/", Pairs: env("C", "2"), Env: env("A", "2", "B", "1", "C", "2")},
			},
		},
		{
			name: "LABEL pairs and legacy form, substituted",
			src:  "FROM a\nARG V=1.2\nLABEL org.opencontainers.image.version=$V \"com.example.note\"=\"a b\"\nLABEL maintainer Jane Doe\n",
			want: []Step{
				{Line: 3, Kind: KindLabel, Workdir: "/", Args: env("V", "1.2"), Pairs: env("org.opencontainers.image.version", "1.2", "com.example.note", "a b")},
				{Line: 4, Kind: KindLabel, Workdir: "/", Args: env("V", "1.2"), Pairs: env("maintainer", "Jane Doe")},
			},
		},
		{
			name: "substitution forms",
			src: "FROM a\nARG SET=v EMPTY=\nARG UNSET\n" +
				"LABEL a=$SET b=${SET} c=${UNSET:-d} d=${EMPTY:-d} e=${EMPTY-d} f=${UNSET-d} " +
				"g=${SET:+alt} h=${EMPTY:+alt} i=${EMPTY+alt} j=${UNSET+alt} k=x${SET}y l=\\$SET m='$SET' " +
				"n=\"$SET\" o=${UNSET:-${SET}} p=$ q=$1 r=${SET:?} s=${UNSET:-a\\}b}\n",
			want: []Step{{Line: 4, Kind: KindLabel, Workdir: "/", Args: env("SET", "v", "EMPTY", ""), Pairs: env(
				"a", "v", "b", "v", "c", "d", "d", "d", "e", "", "f", "d",
				"g", "alt", "h", "", "i", "alt", "j", "", "k", "xvy", "l", "$SET", "m", "$SET",
				"n", "v", "o", "v", "p", "$", "q", "", "r", "v", "s", "a}b")}},
		},
		{
			name: "WORKDIR is relative to the previous one and substituted",
			src:  "FROM a\nWORKDIR app\nWORKDIR ./src/../lib\nENV D=/opt\nWORKDIR $D/x\nWORKDIR ..\n",
			opts: ExpandOptions{BaseWorkdir: "/home/u"},
			want: []Step{
				{Line: 2, Kind: KindWorkdir, Workdir: "/home/u/app"},
				{Line: 3, Kind: KindWorkdir, Workdir: "/home/u/app/lib"},
				{Line: 4, Kind: KindEnv, Workdir: "/home/u/app/lib", Pairs: env("D", "/opt"), Env: env("D", "/opt")},
				{Line: 5, Kind: KindWorkdir, Workdir: "/opt/x", Env: env("D", "/opt")},
				{Line: 6, Kind: KindWorkdir, Workdir: "/opt", Env: env("D", "/opt")},
			},
		},
		{
			name: "the base image's environment is seen by substitution, ENV overrides it",
			src:  "FROM a\nWORKDIR $HOME/app\nENV HOME=/root\nCOPY x $HOME/\n",
			opts: ExpandOptions{BaseEnv: []string{"PATH=/bin", "HOME=/home/u"}},
			want: []Step{
				{Line: 2, Kind: KindWorkdir, Workdir: "/home/u/app"},
				{Line: 3, Kind: KindEnv, Workdir: "/home/u/app", Pairs: env("HOME", "/root"), Env: env("HOME", "/root")},
				{Line: 4, Kind: KindCopy, Workdir: "/home/u/app", Sources: []string{"x"}, Dest: "/root/", Env: env("HOME", "/root")},
			},
		},
		{
			name: "USER is kept as given, substituted",
			src:  "FROM a\nARG UID=1000\nUSER ${UID}:${GID:-100}\nRUN id\n",
			want: []Step{
				{Line: 3, Kind: KindUser, User: "1000:100", Workdir: "/", Args: env("UID", "1000")},
				{Line: 4, Kind: KindRun, Shell: "id", User: "1000:100", Workdir: "/", Args: env("UID", "1000")},
			},
		},
		{
			name: "COPY forms: JSON, flags, relative and directory destinations, patterns",
			src: "FROM a\nWORKDIR /app\nARG OWNER=1000\n" +
				"COPY [\"my file.txt\", \"./dir/\", \"dest dir/\"]\n" +
				"COPY --chown=${OWNER}:users --chmod=0755 run.sh /usr/local/bin/run\n" +
				"COPY --chmod=4755 ./bin/../tool .\n" +
				"COPY *.py src/[ab]?.txt ../\n" +
				"ADD vendor.tar.gz /\n" +
				"copy --chown=\"1:2\" [\"a\", \"/b\"]\n",
			want: []Step{
				{Line: 2, Kind: KindWorkdir, Workdir: "/app"},
				{Line: 4, Kind: KindCopy, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"my file.txt", "dir"}, Dest: "/app/dest dir/"},
				{Line: 5, Kind: KindCopy, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"run.sh"}, Dest: "/usr/local/bin/run", Chown: "1000:users", Chmod: mode(0o755)},
				{Line: 6, Kind: KindCopy, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"tool"}, Dest: "/app/", Chmod: mode(0o4755)},
				{Line: 7, Kind: KindCopy, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"*.py", "src/[ab]?.txt"}, Dest: "/"},
				{Line: 8, Kind: KindAdd, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"vendor.tar.gz"}, Dest: "/"},
				{Line: 9, Kind: KindCopy, Workdir: "/app", Args: env("OWNER", "1000"), Sources: []string{"a"}, Dest: "/b", Chown: "1:2"},
			},
		},
		{
			name: "ARG: scopes, defaults, build arguments, ENV precedence",
			src: "ARG TAG=3.12 UNUSED_GLOBAL\nARG REG\nFROM ${REG:-docker.io}/python:$TAG\n" +
				"ARG TAG\nARG MODE=dev\nARG NODEF\nENV MODE=prod\nRUN echo\nARG FROMENV=$MODE\nRUN echo\n",
			opts: ExpandOptions{BuildArgs: map[string]string{"TAG": "3.13", "NODEF": "given", "STRAY": "x", "ANOTHER": "y"}},
			from: "docker.io/python:3.13",
			want: []Step{
				{Line: 7, Kind: KindEnv, Workdir: "/", Pairs: env("MODE", "prod"), Env: env("MODE", "prod"), Args: env("TAG", "3.13", "MODE", "dev", "NODEF", "given")},
				{Line: 8, Kind: KindRun, Shell: "echo", Workdir: "/", Env: env("MODE", "prod"), Args: env("TAG", "3.13", "MODE", "dev", "NODEF", "given")},
				{Line: 10, Kind: KindRun, Shell: "echo", Workdir: "/", Env: env("MODE", "prod"), Args: env("TAG", "3.13", "MODE", "dev", "NODEF", "given", "FROMENV", "prod")},
			},
		},
		{
			name: "a global ARG's default reaches the stage only when declared again",
			src:  "ARG V=1\nFROM a\nLABEL before=$V\nARG V\nLABEL after=$V\n",
			want: []Step{
				{Line: 3, Kind: KindLabel, Workdir: "/", Pairs: env("before", "")},
				{Line: 5, Kind: KindLabel, Workdir: "/", Pairs: env("after", "1"), Args: env("V", "1")},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := expand(t, tc.src, tc.opts)
			if tc.from == "" {
				tc.from = "a"
			}
			if st.From != tc.from {
				t.Errorf("From = %q, want %q", st.From, tc.from)
			}
			if len(st.Steps) != len(tc.want) {
				t.Fatalf("%d steps, want %d:\n%+v", len(st.Steps), len(tc.want), st.Steps)
			}
			for i := range tc.want {
				if !reflect.DeepEqual(st.Steps[i], tc.want[i]) {
					t.Errorf("step %d:\n got  %+v\n want %+v", i, st.Steps[i], tc.want[i])
				}
			}
		})
	}
}

func TestUnusedBuildArgs(t *testing.T) {
	st := expand(t, "ARG G\nFROM a\nARG S=1\n", ExpandOptions{BuildArgs: map[string]string{"S": "2", "G": "x", "Z": "1", "B": "2"}})
	if want := []string{"B", "Z"}; !reflect.DeepEqual(st.UnusedBuildArgs, want) {
		t.Errorf("UnusedBuildArgs = %v, want %v", st.UnusedBuildArgs, want)
	}
	st = expand(t, "FROM a\n", ExpandOptions{})
	if st.UnusedBuildArgs != nil {
		t.Errorf("UnusedBuildArgs = %v, want none", st.UnusedBuildArgs)
	}
}

const example = `ARG BASE=localhost:5000/python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
FROM $BASE
ENV PIP_INDEX_URL=http://10.0.0.1:8080/simple APP=/app
WORKDIR $APP
COPY requirements.txt ./
RUN pip install -r requirements.txt
COPY --chmod=0755 run.sh /usr/local/bin/run
USER 1000:1000
LABEL org.opencontainers.image.title="demo app"
`

func TestExample(t *testing.T) {
	f := parse(t, example)
	sum := sha256.Sum256([]byte(example))
	if want := "sha256:" + hex.EncodeToString(sum[:]); f.Digest() != want {
		t.Errorf("Digest() = %s, want %s", f.Digest(), want)
	}
	st, err := f.Expand(ExpandOptions{BuildArgs: map[string]string{"PIP_EXTRA": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "localhost:5000/python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; st.From != want || st.FromLine != 2 {
		t.Errorf("From = %q line %d, want %q line 2", st.From, st.FromLine, want)
	}
	e := env("PIP_INDEX_URL", "http://10.0.0.1:8080/simple", "APP", "/app")
	want := []Step{
		{Line: 3, Kind: KindEnv, Pairs: e, Workdir: "/", Env: e},
		{Line: 4, Kind: KindWorkdir, Workdir: "/app", Env: e},
		{Line: 5, Kind: KindCopy, Sources: []string{"requirements.txt"}, Dest: "/app/", Workdir: "/app", Env: e},
		{Line: 6, Kind: KindRun, Shell: "pip install -r requirements.txt", Workdir: "/app", Env: e},
		{Line: 7, Kind: KindCopy, Sources: []string{"run.sh"}, Dest: "/usr/local/bin/run", Chmod: mode(0o755), Workdir: "/app", Env: e},
		{Line: 8, Kind: KindUser, User: "1000:1000", Workdir: "/app", Env: e},
		{Line: 9, Kind: KindLabel, Pairs: env("org.opencontainers.image.title", "demo app"), User: "1000:1000", Workdir: "/app", Env: e},
	}
	if !reflect.DeepEqual(st.Steps, want) {
		t.Errorf("steps:\n got  %+v\n want %+v", st.Steps, want)
	}
	if want := []string{"PIP_EXTRA"}; !reflect.DeepEqual(st.UnusedBuildArgs, want) {
		t.Errorf("UnusedBuildArgs = %v, want %v", st.UnusedBuildArgs, want)
	}
	run := st.Steps[3]
	if got, want := run.Environ([]string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8"}), []string{
		"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "PIP_INDEX_URL=http://10.0.0.1:8080/simple", "APP=/app",
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
	// The same Dockerfile and build args give the same keys; every step's key differs.
	again := expand(t, example, ExpandOptions{BuildArgs: map[string]string{"PIP_EXTRA": "1"}})
	seen := map[string]int{}
	for i, s := range st.Steps {
		if k := again.Steps[i].Key(); k != s.Key() {
			t.Errorf("step %d: key %q then %q", i, s.Key(), k)
		}
		if j, ok := seen[s.Key()]; ok {
			t.Errorf("steps %d and %d share key %q", j, i, s.Key())
		}
		seen[s.Key()] = i
	}
	// Another base image is another FROM, not another key: the builder chains keys with
	// the parent layer's digest.
	other := expand(t, example, ExpandOptions{BuildArgs: map[string]string{"BASE": "localhost:5000/python:3.13"}})
	if other.From != "localhost:5000/python:3.13" {
		t.Errorf("From with a build arg = %q", other.From)
	}
}

func TestKey(t *testing.T) {
	step := func(src string) Step {
		t.Helper()
		st := expand(t, "FROM a\n"+src, ExpandOptions{BuildArgs: map[string]string{"B": "2"}})
		return st.Steps[len(st.Steps)-1]
	}
	base := step("RUN make\n")
	for _, tc := range []struct {
		name string
		src  string
		same bool
	}{
		{"same step on another line", "\n\n\nRUN make\n", true},
		{"same step with other spacing in the keyword", "run  make\n", true},
		{"another command", "RUN make all\n", false},
		{"exec form of the same words", "RUN [\"make\"]\n", false},
		{"another working directory", "WORKDIR /src\nRUN make\n", false},
		{"another user", "USER nobody\nRUN make\n", false},
		{"an ENV value", "ENV CC=clang\nRUN make\n", false},
		{"an ARG value", "ARG B\nRUN make\n", false},
		{"an ARG declared without value and unset", "ARG UNSET\nRUN make\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := step(tc.src)
			if got := s.Key() == base.Key(); got != tc.same {
				t.Errorf("key %q vs %q: same = %v, want %v", s.Key(), base.Key(), got, tc.same)
			}
		})
	}
	pairs := []struct{ a, b string }{
		{"COPY [\"a b\", \"/d/\"]\n", "COPY a b /d/\n"},
		{"COPY a /d\n", "COPY a /d/\n"},
		{"COPY a /d\n", "ADD a /d\n"},
		{"COPY a /d\n", "COPY --chmod=644 a /d\n"},
		{"COPY --chmod=644 a /d\n", "COPY --chmod=0755 a /d\n"},
		{"COPY a /d\n", "COPY --chown=1 a /d\n"},
		{"ENV A=1\n", "LABEL A=1\n"},
		{"ENV A=1 B=2\n", "ENV A=\"1 B=2\"\n"},
		{"USER a\n", "USER b\n"},
		{"WORKDIR /a\n", "WORKDIR /b\n"},
	}
	for _, p := range pairs {
		if a, b := step(p.a), step(p.b); a.Key() == b.Key() {
			t.Errorf("%q and %q share key %q", p.a, p.b, a.Key())
		}
	}
	if a, b := step("COPY --chmod=755 a /d\n"), step("COPY --chmod=0755 a /d\n"); a.Key() != b.Key() {
		t.Errorf("--chmod=755 and --chmod=0755 keys differ: %q, %q", a.Key(), b.Key())
	}
}

func TestEnviron(t *testing.T) {
	st := expand(t, "FROM a\nARG PATH=/arg ONLY=arg SHADOW=arg\nENV SHADOW=env X=1\nRUN env\n", ExpandOptions{})
	got := st.Steps[1].Environ([]string{"PATH=/base", "HOME=/root"})
	want := []string{"PATH=/base", "HOME=/root", "SHADOW=env", "X=1", "ONLY=arg"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
}

func TestParseReader(t *testing.T) {
	f, err := Parse(strings.NewReader(example))
	if err != nil {
		t.Fatal(err)
	}
	if g := parse(t, example); f.Digest() != g.Digest() {
		t.Errorf("Parse and ParseBytes digests differ")
	}
	if _, err := Parse(failingReader{}); err == nil || !strings.Contains(err.Error(), "reading the Dockerfile") {
		t.Errorf("Parse of a failing reader: %v", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// FuzzParse checks that no input makes Parse or Expand panic.
func FuzzParse(f *testing.F) {
	f.Add(example)
	f.Add("FROM a\nRUN x \\\n y\nENV A=\"b c\" D=${E:-f}\nCOPY [\"a\",\"b/\"]\n")
	f.Add("# escape=`\nFROM a\nLABEL x=${y:+`}}\n")
	f.Fuzz(func(t *testing.T, src string) {
		file, err := ParseBytes([]byte(src))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		st, err := file.Expand(ExpandOptions{BuildArgs: map[string]string{"A": "1"}})
		if err != nil {
			return
		}
		for _, s := range st.Steps {
			_ = s.Key()
		}
	})
}
