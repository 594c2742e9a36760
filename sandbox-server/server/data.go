package server

import (
	"errors"
	"io"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/watch"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"

	"context"
)

// dataService implements the Sandbox service. Every method returns through toStatus.
type dataService struct {
	sandboxv1.UnimplementedSandboxServer
	ws    *workspace.Workspace
	exec  *executor
	watch *watch.Root
}

func (d *dataService) Exec(req *sandboxv1.ExecRequest, stream sandboxv1.Sandbox_ExecServer) error {
	return toStatus(d.exec.run(stream.Context(), req, stream.Send))
}

func (d *dataService) WriteFiles(ctx context.Context, req *sandboxv1.WriteFilesRequest) (*sandboxv1.WriteFilesResponse, error) {
	resp, err := d.ws.WriteFiles(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) WriteFileStream(stream sandboxv1.Sandbox_WriteFileStreamServer) error {
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.Join(errInvalid, errors.New("empty stream: the first message must carry a header"))
		}
		return toStatus(err)
	}
	if first.GetHeader() == nil {
		return toStatus(errors.Join(errInvalid, errors.New("the first message must carry a header")))
	}
	pending := first.GetData()
	next := func() ([]byte, error) {
		if pending != nil {
			b := pending
			pending = nil
			return b, nil
		}
		m, err := stream.Recv()
		if err != nil {
			return nil, err // io.EOF ends the file cleanly
		}
		if m.GetHeader() != nil {
			return nil, errors.Join(errInvalid, errors.New("header repeated after the first message"))
		}
		if m.GetData() == nil {
			return []byte{}, nil
		}
		return m.GetData(), nil
	}
	n, err := d.ws.WriteStream(stream.Context(), first.GetHeader(), next)
	if err != nil {
		return toStatus(err)
	}
	return stream.SendAndClose(&sandboxv1.WriteFileStreamResponse{BytesWritten: n})
}

func (d *dataService) GetReadFilesPlan(ctx context.Context, req *sandboxv1.GetReadFilesPlanRequest) (*sandboxv1.ReadFilesPlan, error) {
	resp, err := d.ws.ReadPlan(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) ReadFiles(ctx context.Context, req *sandboxv1.ReadFilesRequest) (*sandboxv1.ReadFilesResponse, error) {
	resp, err := d.ws.ReadFiles(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) ReadFileStream(req *sandboxv1.ReadFileStreamRequest, stream sandboxv1.Sandbox_ReadFileStreamServer) error {
	return toStatus(d.ws.ReadStream(stream.Context(), req, stream.Send))
}

func (d *dataService) Stat(ctx context.Context, req *sandboxv1.StatRequest) (*sandboxv1.StatResponse, error) {
	resp, err := d.ws.Stat(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) List(ctx context.Context, req *sandboxv1.ListRequest) (*sandboxv1.ListResponse, error) {
	resp, err := d.ws.List(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) Mkdir(ctx context.Context, req *sandboxv1.MkdirRequest) (*sandboxv1.MkdirResponse, error) {
	return &sandboxv1.MkdirResponse{}, toStatus(d.ws.Mkdir(ctx, req))
}

func (d *dataService) Remove(ctx context.Context, req *sandboxv1.RemoveRequest) (*sandboxv1.RemoveResponse, error) {
	return &sandboxv1.RemoveResponse{}, toStatus(d.ws.Remove(ctx, req))
}

func (d *dataService) Rename(ctx context.Context, req *sandboxv1.RenameRequest) (*sandboxv1.RenameResponse, error) {
	return &sandboxv1.RenameResponse{}, toStatus(d.ws.Rename(ctx, req))
}

func (d *dataService) Symlink(ctx context.Context, req *sandboxv1.SymlinkRequest) (*sandboxv1.SymlinkResponse, error) {
	return &sandboxv1.SymlinkResponse{}, toStatus(d.ws.Symlink(ctx, req))
}

func (d *dataService) Find(ctx context.Context, req *sandboxv1.FindRequest) (*sandboxv1.FindResponse, error) {
	resp, err := d.ws.Find(ctx, req)
	return resp, toStatus(err)
}

func (d *dataService) Grep(ctx context.Context, req *sandboxv1.GrepRequest) (*sandboxv1.GrepResponse, error) {
	resp, err := d.ws.Grep(ctx, req)
	return resp, toStatus(err)
}
