package roster

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/razorbill/flo/libs/fault"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/registry/internal/store"
)

// Registration limits.
const (
	// DefaultMaxConcurrency is used when a worker asks for zero.
	DefaultMaxConcurrency = 10
	// MaxConcurrencyLimit bounds max_concurrency.
	MaxConcurrencyLimit = 10_000
	// MaxMetadataBytes bounds the metadata JSON.
	MaxMetadataBytes = 16 << 10
	// MaxProcesses bounds the processes of one worker.
	MaxProcesses = 256
	// MaxProcessNameBytes bounds one process name ("stream/group" included).
	MaxProcessNameBytes = 512
	// MaxMachineIDBytes bounds machine_id.
	MaxMachineIDBytes = 256
)

// newWorkerID makes up an id for a worker that sent none.
func newWorkerID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "worker-" + hex.EncodeToString(b[:])
}

// normalize validates a registration and fills its defaults. It reports
// whether the id was made up here.
func normalize(r *store.Registration) (generated bool, err error) {
	if err := text.Name("namespace", r.Namespace); err != nil {
		return false, err
	}
	if r.ID == "" {
		r.ID, generated = newWorkerID(), true
	} else if err := text.WorkerID("worker_id", r.ID); err != nil {
		return false, err
	}
	var defaultKind store.Kind
	switch r.Type {
	case store.ActionWorker:
		defaultKind = store.ActionProcess
	case store.StreamWorker:
		defaultKind = store.StreamProcess
	case "":
		return false, fault.Invalidf("worker_type is required: action or stream")
	default:
		return false, fault.Invalidf("worker_type %s is unknown: use action or stream", r.Type)
	}
	switch {
	case r.MaxConcurrency == 0:
		r.MaxConcurrency = DefaultMaxConcurrency
	case r.MaxConcurrency < 0 || r.MaxConcurrency > MaxConcurrencyLimit:
		return false, fault.Invalidf("max_concurrency %d is out of range: 1 to %d (0 means %d)", r.MaxConcurrency, MaxConcurrencyLimit, DefaultMaxConcurrency)
	}
	if len(r.MachineID) > MaxMachineIDBytes {
		return false, fault.Invalidf("machine_id is %d bytes, at most %d", len(r.MachineID), MaxMachineIDBytes)
	}
	if err := text.Storable("machine_id", r.MachineID); err != nil {
		return false, err
	}
	if r.Metadata, err = normalizeMetadata(r.Metadata); err != nil {
		return false, err
	}
	if len(r.Processes) > MaxProcesses {
		return false, fault.Invalidf("processes: %d given, at most %d", len(r.Processes), MaxProcesses)
	}
	seen := make(map[string]bool, len(r.Processes))
	for i := range r.Processes {
		p := &r.Processes[i]
		switch {
		case p.Name == "":
			return false, fault.Invalidf("processes[%d].name is required", i)
		case len(p.Name) > MaxProcessNameBytes:
			return false, fault.Invalidf("processes[%d].name is %d bytes, at most %d", i, len(p.Name), MaxProcessNameBytes)
		case seen[p.Name]:
			return false, fault.Invalidf("processes[%d].name %q is listed twice", i, p.Name)
		}
		if err := text.Storable(fmt.Sprintf("processes[%d].name", i), p.Name); err != nil {
			return false, err
		}
		seen[p.Name] = true
		switch p.Kind {
		case "":
			p.Kind = defaultKind
		case store.ActionProcess, store.StreamProcess:
		default:
			return false, fault.Invalidf("processes[%d].kind %s is unknown: use action or stream_consumer", i, p.Kind)
		}
		p.RunCount, p.FailCount = 0, 0
	}
	return generated, nil
}

// normalizeMetadata accepts a JSON object or nothing (empty or blank).
func normalizeMetadata(md string) (string, error) {
	if len(md) > MaxMetadataBytes {
		return "", fault.Invalidf("metadata is %d bytes, at most %d", len(md), MaxMetadataBytes)
	}
	// jsonb refuses NUL and invalid UTF-8 that json.Valid lets through.
	if err := text.Storable("metadata", md); err != nil {
		return "", err
	}
	trimmed := strings.TrimSpace(md)
	if trimmed == "" {
		return "", nil
	}
	if !json.Valid([]byte(trimmed)) {
		return "", fault.Invalidf("metadata is not valid JSON")
	}
	if trimmed[0] != '{' {
		return "", fault.Invalidf("metadata must be a JSON object")
	}
	return trimmed, nil
}

// validateBeat checks a heartbeat's numbers.
func validateBeat(b store.Beat) error {
	if err := requireIDs(b.Namespace, b.ID); err != nil {
		return err
	}
	if b.CurrentLoad < 0 {
		return fault.Invalidf("current_load %d must not be negative", b.CurrentLoad)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"cpu_load", b.CPULoad}, {"memory_load", b.MemoryLoad}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fault.Invalidf("%s %v must be a non-negative number", f.name, f.v)
		}
	}
	return nil
}

func requireIDs(namespace, id string) error {
	if err := text.Name("namespace", namespace); err != nil {
		return err
	}
	return text.WorkerID("worker_id", id)
}
