package grpcapi

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/registry/internal/store"
	"github.com/razorbill/flo/services/registry/internal/workerevent"
)

// workerTypeName maps the API enum to the domain name: unspecified to ""
// (which validation calls missing) and unknown values to a name validation
// rejects.
func workerTypeName(t flov1.WorkerType) store.Type {
	switch t {
	case flov1.WorkerType_WORKER_TYPE_UNSPECIFIED:
		return ""
	case flov1.WorkerType_WORKER_TYPE_ACTION:
		return store.ActionWorker
	case flov1.WorkerType_WORKER_TYPE_STREAM:
		return store.StreamWorker
	default:
		return store.Type(fmt.Sprintf("WorkerType(%d)", int32(t)))
	}
}

func workerTypeProto(t store.Type) flov1.WorkerType {
	switch t {
	case store.ActionWorker:
		return flov1.WorkerType_WORKER_TYPE_ACTION
	case store.StreamWorker:
		return flov1.WorkerType_WORKER_TYPE_STREAM
	default:
		return flov1.WorkerType_WORKER_TYPE_UNSPECIFIED
	}
}

// processKindName maps the API enum like workerTypeName; "" means "the
// default for the worker's type".
func processKindName(k flov1.ProcessKind) store.Kind {
	switch k {
	case flov1.ProcessKind_PROCESS_KIND_UNSPECIFIED:
		return ""
	case flov1.ProcessKind_PROCESS_KIND_ACTION:
		return store.ActionProcess
	case flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER:
		return store.StreamProcess
	default:
		return store.Kind(fmt.Sprintf("ProcessKind(%d)", int32(k)))
	}
}

func processKindProto(k store.Kind) flov1.ProcessKind {
	switch k {
	case store.ActionProcess:
		return flov1.ProcessKind_PROCESS_KIND_ACTION
	case store.StreamProcess:
		return flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER
	default:
		return flov1.ProcessKind_PROCESS_KIND_UNSPECIFIED
	}
}

func statusProto(s store.Status) flov1.WorkerStatus { return workerevent.Status(s) }

func workerProto(w store.Worker) *flov1.Worker {
	out := &flov1.Worker{
		Namespace:      w.Namespace,
		WorkerId:       w.ID,
		WorkerType:     workerTypeProto(w.Type),
		Status:         statusProto(w.Status),
		MaxConcurrency: w.MaxConcurrency,
		CurrentLoad:    w.CurrentLoad,
		CpuLoad:        w.CPULoad,
		MemoryLoad:     w.MemoryLoad,
		MachineId:      w.MachineID,
		Metadata:       w.Metadata,
		TasksCompleted: w.TasksCompleted,
		TasksFailed:    w.TasksFailed,
		Processes:      make([]*flov1.WorkerProcess, len(w.Processes)),
		RegisteredAt:   timestamppb.New(w.RegisteredAt),
		LastHeartbeat:  timestamppb.New(w.LastHeartbeat),
	}
	for i, p := range w.Processes {
		wp := &flov1.WorkerProcess{Name: p.Name, Kind: processKindProto(p.Kind), RunCount: p.RunCount, FailCount: p.FailCount}
		if !p.LastRunAt.IsZero() {
			wp.LastRunAt = timestamppb.New(p.LastRunAt)
		}
		out.Processes[i] = wp
	}
	return out
}
