package deploy

import (
	"io"
	"os"
)

// progress is where preflight's notes go: Progress, else standard error.
func (o Options) progress() io.Writer {
	if o.Progress != nil {
		return o.Progress
	}
	return os.Stderr
}
