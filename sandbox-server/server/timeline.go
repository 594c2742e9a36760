package server

import (
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"
)

// timeline records when the steps of this sandbox's one allocation happened, as Unix
// nanoseconds of the sandbox's clock (which gVisor keeps in step with the host's once a
// sandbox has warmed up): where an allocation's time goes, seen from inside. Each step keeps
// its first time. It is logged once, after the agent's first call ("allocation timeline").
type timeline struct {
	initReceived, initAnswered     atomic.Int64 // the successful InitializeTLS
	dataAccepted, handshakeDone    atomic.Int64 // the first data connection's handshake
	firstCallStart, firstCallEnded atomic.Int64 // the first data-plane call's handler
}

// mark sets step to now unless it is set.
func mark(step *atomic.Int64) {
	if step.Load() == 0 {
		step.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// TimelineMessage is the message of the log record that carries an allocation's Timeline
// under the key "timeline" (with a JSON handler: {"msg":"allocation timeline",
// "timeline":{"init_received_ns":...}}; ParseTimeline reads it back).
const TimelineMessage = "allocation timeline"

// timelineKey is the record's key for the Timeline; ParseTimeline's struct tag repeats it.
const timelineKey = "timeline"

// Timeline is that record's value: Unix nanoseconds of each step, 0 for a step that did not
// happen.
type Timeline struct {
	InitReceived   int64 `json:"init_received_ns"`
	InitAnswered   int64 `json:"init_answered_ns"`
	DataAccepted   int64 `json:"data_accepted_ns"`
	HandshakeDone  int64 `json:"handshake_done_ns"`
	FirstCallStart int64 `json:"first_call_start_ns"`
	FirstCallEnd   int64 `json:"first_call_end_ns"`
}

// log writes the Timeline record.
func (t *timeline) log(l *slog.Logger) {
	LogTimeline(l, Timeline{
		InitReceived: t.initReceived.Load(), InitAnswered: t.initAnswered.Load(),
		DataAccepted: t.dataAccepted.Load(), HandshakeDone: t.handshakeDone.Load(),
		FirstCallStart: t.firstCallStart.Load(), FirstCallEnd: t.firstCallEnded.Load()})
}

// LogTimeline writes tl as the server does after an allocation's first call (tests of its
// readers write their fixtures with it).
func LogTimeline(l *slog.Logger, tl Timeline) {
	l.Info(TimelineMessage, slog.Any(timelineKey, tl))
}

// handshake marks the first data connection's handshake: its start (done false) and end
// (fuse.DataOptions.Handshake).
func (t *timeline) handshake(done bool) {
	if done {
		mark(&t.handshakeDone)
	} else {
		mark(&t.dataAccepted)
	}
}

// ParseTimeline returns the Timeline of a JSON log line, if the line is that record.
func ParseTimeline(line []byte) (Timeline, bool) {
	var rec struct {
		Msg      string   `json:"msg"`
		Timeline Timeline `json:"timeline"`
	}
	if json.Unmarshal(line, &rec) != nil || rec.Msg != TimelineMessage {
		return Timeline{}, false
	}
	return rec.Timeline, true
}
