package manager

import (
	"context"
	"fmt"

	"github.com/fusebox-dev/fusebox/manager/auth"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// TemplateEditor changes the templates a running manager serves (Service.Templates): it turns
// a templates file into the allocator's templates and the manager's pools (SetTemplate,
// RemoveTemplate), and keeps the result for the manager's next start. Errors wrap ErrInvalid
// for a bad file or image, ErrUnknownTemplate or ErrUnsupported as the Manager's do.
type TemplateEditor interface {
	// AddTemplates serves the templates of file (a templates file) from now on: AddTemplates'
	// contract in the API. It returns one change per template of file, in its order.
	AddTemplates(ctx context.Context, file []byte) ([]TemplateChange, error)
	// RemoveTemplate stops serving template name.
	RemoveTemplate(ctx context.Context, name string) (TemplateChange, error)
}

// operator returns an error unless ctx's caller is an operator: only operators change the
// templates every tenant is served.
func operator(ctx context.Context, what string) error {
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	if !id.Operator {
		return fmt.Errorf("%w: %s is for operators (root, the manager's user, --operator-uids or the policy's operators)", auth.ErrDenied, what)
	}
	return nil
}

// templateEditor returns s.Templates, or ErrUnsupported when the templates are fixed.
func (s *Service) templateEditor() (TemplateEditor, error) {
	if s.Templates == nil {
		return nil, fmt.Errorf("%w: this manager's templates are fixed by its configuration (in a cluster, change the stack's fusebox:templates and run fusebox up)", ErrUnsupported)
	}
	return s.Templates, nil
}

// AddTemplates serves the templates of a templates file from now on (operators only).
func (s *Service) AddTemplates(ctx context.Context, req *managerv1.AddTemplatesRequest) (*managerv1.AddTemplatesResponse, error) {
	if err := operator(ctx, "adding templates"); err != nil {
		return nil, toStatus(err)
	}
	ed, err := s.templateEditor()
	if err != nil {
		return nil, toStatus(err)
	}
	changes, err := ed.AddTemplates(ctx, req.GetTemplates())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &managerv1.AddTemplatesResponse{}
	for _, c := range changes {
		resp.Changes = append(resp.Changes, changeProto(c))
	}
	return resp, nil
}

// RemoveTemplate stops serving a template (operators only).
func (s *Service) RemoveTemplate(ctx context.Context, req *managerv1.RemoveTemplateRequest) (*managerv1.RemoveTemplateResponse, error) {
	if err := operator(ctx, "removing a template"); err != nil {
		return nil, toStatus(err)
	}
	ed, err := s.templateEditor()
	if err != nil {
		return nil, toStatus(err)
	}
	c, err := ed.RemoveTemplate(ctx, req.GetTemplate())
	if err != nil {
		return nil, toStatus(err)
	}
	return &managerv1.RemoveTemplateResponse{Change: changeProto(c)}, nil
}

func changeProto(c TemplateChange) *managerv1.TemplateChange {
	return &managerv1.TemplateChange{Template: c.Template, Change: c.Change, Hash: c.Hash, Image: c.Image,
		Drained: int32(c.Drained), Bound: int32(c.Bound)}
}
