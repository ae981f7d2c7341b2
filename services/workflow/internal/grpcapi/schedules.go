package grpcapi

import (
	"context"

	"github.com/razorbill/flo/libs/page"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/store"
)

// Who started a run, in WorkflowRun.started_by.
const (
	startedByClient   = "client"
	startedBySchedule = "schedule"
	startedByWorkflow = "workflow"
	startedByTrigger  = "trigger"
)

// ListSchedules lists a namespace's schedules by workflow name.
func (s *Server) ListSchedules(ctx context.Context, req *flov1.ListSchedulesRequest) (*flov1.ListSchedulesResponse, error) {
	p, err := page.New(req.GetLimit(), req.GetPageToken(), page.MaxLimit, 1)
	if err != nil {
		return nil, err
	}
	ss, next, err := s.catalog.Schedules(ctx, req.GetNamespace(), p)
	if err != nil {
		return nil, err
	}
	out := &flov1.ListSchedulesResponse{Schedules: make([]*flov1.WorkflowSchedule, len(ss)), NextPageToken: next}
	for i, sc := range ss {
		out.Schedules[i] = scheduleProto(sc)
	}
	return out, nil
}

func scheduleProto(s store.Schedule) *flov1.WorkflowSchedule {
	return &flov1.WorkflowSchedule{
		Workflow: s.Workflow, Version: s.Version, Cron: s.Cron, Timezone: s.Timezone, IntervalMs: s.IntervalMS,
		MaxConcurrent: int32(s.MaxConcurrent), State: s.State(), NextFireAt: timestamp(s.NextFireAt),
		LastFireAt: timestamp(s.LastFireAt), LastRunId: s.LastRunID, Fired: s.Fired, Skipped: s.Skipped,
		LastSkippedAt: timestamp(s.LastSkippedAt),
	}
}

// startedBy says who started a run.
func startedBy(r *engine.Run) string {
	switch {
	case !r.ScheduledFor.IsZero():
		return startedBySchedule
	case r.TriggerRecord != "":
		return startedByTrigger
	case r.ParentRunID != "":
		return startedByWorkflow
	}
	return startedByClient
}
