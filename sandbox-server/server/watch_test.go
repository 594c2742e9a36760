package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
)

// TestWatchThroughTheClient: Watch through the real client: ready before any change, a change
// after it, the jail's code for a way out, the limit's code, and (forwardServer's leak check)
// nothing left once the streams are cancelled.
func TestWatchThroughTheClient(t *testing.T) {
	sb, _, _ := forwardServer(t, Options{Limits: Limits{MaxWatches: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.Mkdir(ctx, "d", false); err != nil {
		t.Fatal(err)
	}
	w, err := sb.Watch(ctx, "d", client.WatchOptions{QueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if w.QueueSize != 10 {
		t.Errorf("queue size %d, want 10", w.QueueSize)
	}
	if _, err := sb.Watch(ctx, "d", client.WatchOptions{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second watch with MaxWatches 1: %v, want ResourceExhausted", err)
	}
	if err := sb.Mkdir(ctx, "d/sub", false); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Recv()
	if err != nil || ev.Path != "d/sub" || ev.Kind != client.WatchCreate || !ev.IsDir || ev.Count != 1 {
		t.Fatalf("got %+v %v, want the create of directory d/sub", ev, err)
	}
	w.Close()
	if _, err := w.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Recv after Close: %v, want Canceled", err)
	}
	// Refused before the limit is counted: the one place may still be taken.
	for _, p := range []string{"..", "/", "../x"} {
		if _, err := sb.Watch(ctx, p, client.WatchOptions{}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("watch %q: %v, want PermissionDenied", p, err)
		}
	}
}
