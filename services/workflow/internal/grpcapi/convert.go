package grpcapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/coalesce"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/runner"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// workflowStatus maps the errors only the workflow service knows to status
// codes, and returns nil for any other; grpcserver.ErrorInterceptor maps the
// rest.
func workflowStatus(err error) error {
	var invalid *definition.ValidationError
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err // already a status, made by validationStatus
	}
	switch {
	case errors.As(err, &invalid):
		return validationStatus(invalid)
	case errors.Is(err, store.ErrVersionExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, coalesce.ErrStopped):
		return status.Error(codes.Unavailable, "workflow service is stopping")
	}
	return nil
}

// validationStatus is InvalidArgument with every error diagnostic spelled
// out in the message and each diagnostic, warnings too, as a field
// violation, so clients can show them one per line.
func validationStatus(e *definition.ValidationError) error {
	var errs []string
	br := &errdetails.BadRequest{}
	for _, d := range e.Diagnostics {
		if d.Severity == definition.Error {
			errs = append(errs, diagnosticLine(d))
		}
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
			Field: d.Path, Description: diagnosticLine(d), Reason: string(d.Code),
		})
	}
	st := status.New(codes.InvalidArgument, "invalid workflow definition: "+strings.Join(errs, "; "))
	if withDetails, err := st.WithDetails(br); err == nil {
		st = withDetails
	}
	return st.Err()
}

// diagnosticLine renders a diagnostic as "E301 line 12:5 steps.x: message".
func diagnosticLine(d definition.Diagnostic) string {
	var b strings.Builder
	b.WriteString(string(d.Code))
	if d.Pos.Line > 0 {
		b.WriteString(" line ")
		b.WriteString(d.Pos.String())
	}
	if d.Path != "" {
		b.WriteString(" ")
		b.WriteString(d.Path)
	}
	b.WriteString(": ")
	b.WriteString(d.Message)
	return b.String()
}

func diagnosticsProto(ds []definition.Diagnostic) []*flov1.Diagnostic {
	out := make([]*flov1.Diagnostic, len(ds))
	for i, d := range ds {
		sev := flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_ERROR
		if d.Severity == definition.Warning {
			sev = flov1.DiagnosticSeverity_DIAGNOSTIC_SEVERITY_WARNING
		}
		out[i] = &flov1.Diagnostic{
			Code: string(d.Code), Severity: sev, Message: d.Message,
			Line: int32(d.Pos.Line), Column: int32(d.Pos.Column), Path: d.Path,
		}
	}
	return out
}

func definitionProto(w store.Workflow) *flov1.WorkflowDefinition {
	d := &flov1.WorkflowDefinition{
		Namespace: w.Namespace, Name: w.Name, Version: w.Version, Idempotency: w.Idempotency,
		StartTarget: w.StartTarget, Steps: w.Steps, Yaml: w.YAML, Enabled: w.Enabled, Latest: w.Latest,
	}
	if !w.CreatedAt.IsZero() {
		d.CreatedAt = timestamppb.New(w.CreatedAt)
	}
	return d
}

// runProto renders a run for GetRun and ListRuns: JSON input and outputs
// both raw and as JSON values (what REST shows), outputs in the order the
// steps finished.
func runProto(r *store.Run) *flov1.WorkflowRun {
	out := &flov1.WorkflowRun{
		RunId: r.ID, Namespace: r.Namespace, Workflow: r.Workflow, Version: r.Version,
		Status: runner.RunStatus(r.Status), Terminal: r.Terminal, Input: r.Input, InputValue: jsonValue(r.Input),
		Error: r.Error, IdempotencyKey: r.IdempotencyKey, ParentRunId: r.ParentRunID,
		CreatedAt: timestamp(r.CreatedAt), UpdatedAt: timestamp(r.UpdatedAt), FinishedAt: timestamp(r.FinishedAt),
		StartedBy: startedBy(&r.Run), ScheduledFor: timestamp(r.ScheduledFor),
		SearchAttributes: attributesProto(r.Attributes),
	}
	if !r.Status.Ended() {
		out.CurrentStep = r.Step
	}
	if r.Wait == engine.WaitSignal {
		out.WaitingFor = r.WaitingFor
	}
	names := make([]string, 0, len(r.Outputs))
	for name := range r.Outputs {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := r.Outputs[a].FinishedAt.Compare(r.Outputs[b].FinishedAt); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	for _, name := range names {
		res := r.Outputs[name]
		out.Outputs = append(out.Outputs, &flov1.StepOutput{
			Step: name, Outcome: res.Outcome, Output: res.Output, OutputValue: jsonValue(res.Output),
			Attempts: int32(res.Attempts), FinishedAt: timestamp(res.FinishedAt),
		})
	}
	return out
}

func historyProto(rows []store.HistoryRow) *flov1.RunHistory {
	out := &flov1.RunHistory{Events: make([]*flov1.HistoryEvent, len(rows))}
	for i, h := range rows {
		out.Events[i] = &flov1.HistoryEvent{
			Seq: int64(h.Seq), Type: h.Type, Step: h.Step, Detail: h.Detail, Attempt: int32(h.Attempt), At: timestamp(h.At),
		}
	}
	return out
}

// jsonValue decodes JSON into a protobuf Value; nil when it is not JSON.
func jsonValue(b json.RawMessage) *structpb.Value {
	if len(b) == 0 {
		return nil
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return nil
	}
	return v
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
