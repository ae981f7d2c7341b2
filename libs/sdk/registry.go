package flo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// registryCallTimeout bounds a heartbeat or a deregistration: they must not hold up the work
// itself.
const registryCallTimeout = 10 * time.Second

const (
	// registerAttemptTimeout bounds one registration attempt. It is generous: when thousands
	// of workers start at once (or come back after a gateway restart) the registry answers
	// them in turn, and an attempt given up early only queues again behind the others.
	registerAttemptTimeout = 30 * time.Second
	// registerRetryMin and registerRetryMax bound the wait between registration attempts.
	registerRetryMin = 250 * time.Millisecond
	registerRetryMax = 15 * time.Second
	// retryAfterKey is the trailer in which the gateway says how many seconds a caller over
	// its rate should wait.
	retryAfterKey = "retry-after"
)

// WorkerType says what kind of work a worker does.
type WorkerType string

// The worker types.
const (
	WorkerTypeAction WorkerType = "action"
	WorkerTypeStream WorkerType = "stream"
)

// WorkerStatus is a worker's health and drain state as the registry sees it.
type WorkerStatus string

// The worker statuses. Draining is sticky: it ends only when the worker deregisters.
const (
	// WorkerActive is a healthy worker running tasks.
	WorkerActive WorkerStatus = "active"
	// WorkerIdle is a healthy worker with nothing to do.
	WorkerIdle WorkerStatus = "idle"
	// WorkerDraining is a worker finishing what it holds and taking nothing new.
	WorkerDraining WorkerStatus = "draining"
	// WorkerUnhealthy is a worker whose heartbeats stopped; its next heartbeat makes it active
	// again.
	WorkerUnhealthy WorkerStatus = "unhealthy"
)

// ProcessKind says what a worker process consumes.
type ProcessKind string

// The process kinds.
const (
	ProcessAction         ProcessKind = "action"
	ProcessStreamConsumer ProcessKind = "stream_consumer"
)

var (
	workerTypes = map[flov1.WorkerType]WorkerType{
		flov1.WorkerType_WORKER_TYPE_ACTION: WorkerTypeAction,
		flov1.WorkerType_WORKER_TYPE_STREAM: WorkerTypeStream,
	}
	workerStatuses = map[flov1.WorkerStatus]WorkerStatus{
		flov1.WorkerStatus_WORKER_STATUS_ACTIVE:    WorkerActive,
		flov1.WorkerStatus_WORKER_STATUS_IDLE:      WorkerIdle,
		flov1.WorkerStatus_WORKER_STATUS_DRAINING:  WorkerDraining,
		flov1.WorkerStatus_WORKER_STATUS_UNHEALTHY: WorkerUnhealthy,
	}
	processKinds = map[flov1.ProcessKind]ProcessKind{
		flov1.ProcessKind_PROCESS_KIND_ACTION:          ProcessAction,
		flov1.ProcessKind_PROCESS_KIND_STREAM_CONSUMER: ProcessStreamConsumer,
	}
)

// Worker is a worker's record in the registry.
type Worker struct {
	WorkerID   string       `json:"worker_id"`
	Namespace  string       `json:"namespace"`
	WorkerType WorkerType   `json:"worker_type"`
	Status     WorkerStatus `json:"status"`
	// MaxConcurrency is how many tasks the worker runs at once at most.
	MaxConcurrency int `json:"max_concurrency"`
	// CurrentLoad is how many tasks it was running at its last heartbeat.
	CurrentLoad int     `json:"current_load"`
	CPULoad     float64 `json:"cpu_load,omitempty"`
	MemoryLoad  float64 `json:"memory_load,omitempty"`
	MachineID   string  `json:"machine_id,omitempty"`
	// Metadata is the JSON object the worker registered with, as it is.
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	TasksCompleted int64           `json:"tasks_completed"`
	TasksFailed    int64           `json:"tasks_failed"`
	// Processes are the actions (or stream/group pairs) the worker handles, with their counts.
	Processes     []WorkerProcess `json:"processes"`
	RegisteredAt  time.Time       `json:"registered_at,omitzero"`
	LastHeartbeat time.Time       `json:"last_heartbeat,omitzero"`
}

// WorkerProcess is one action or stream/group a worker handles and how it went there.
type WorkerProcess struct {
	Name string      `json:"name"`
	Kind ProcessKind `json:"kind"`
	// RunCount counts the executions that succeeded, FailCount those that failed.
	RunCount  int64     `json:"run_count"`
	FailCount int64     `json:"fail_count"`
	LastRunAt time.Time `json:"last_run_at,omitzero"`
}

func workerFromProto(w *flov1.Worker) *Worker {
	out := &Worker{
		WorkerID:       w.GetWorkerId(),
		Namespace:      w.GetNamespace(),
		WorkerType:     workerTypes[w.GetWorkerType()],
		Status:         workerStatuses[w.GetStatus()],
		MaxConcurrency: int(w.GetMaxConcurrency()),
		CurrentLoad:    int(w.GetCurrentLoad()),
		CPULoad:        w.GetCpuLoad(),
		MemoryLoad:     w.GetMemoryLoad(),
		MachineID:      w.GetMachineId(),
		TasksCompleted: w.GetTasksCompleted(),
		TasksFailed:    w.GetTasksFailed(),
		Processes:      make([]WorkerProcess, 0, len(w.GetProcesses())),
		RegisteredAt:   timeFromProto(w.GetRegisteredAt()),
		LastHeartbeat:  timeFromProto(w.GetLastHeartbeat()),
	}
	// The registry stores only JSON objects; the check keeps a record that somehow is not from
	// breaking the encoding of the whole Worker.
	if md := w.GetMetadata(); md != "" && json.Valid([]byte(md)) {
		out.Metadata = json.RawMessage(md)
	}
	for _, p := range w.GetProcesses() {
		out.Processes = append(out.Processes, WorkerProcess{
			Name:      p.GetName(),
			Kind:      processKinds[p.GetKind()],
			RunCount:  p.GetRunCount(),
			FailCount: p.GetFailCount(),
			LastRunAt: timeFromProto(p.GetLastRunAt()),
		})
	}
	return out
}

// ListWorkers returns the namespace's workers, ordered by id.
func (c *Client) ListWorkers(ctx context.Context) ([]*Worker, error) {
	svc, err := c.registryService()
	if err != nil {
		return nil, err
	}
	return listPages(0, func(size int32, token string) ([]*flov1.Worker, string, error) {
		resp, err := svc.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: c.namespace, Limit: size, PageToken: token})
		if err != nil {
			return nil, "", fmt.Errorf("list workers: %w", err)
		}
		return resp.GetWorkers(), resp.GetNextPageToken(), nil
	}, workerFromProto)
}

// GetWorker returns the worker id's record.
func (c *Client) GetWorker(ctx context.Context, id string) (*Worker, error) {
	svc, err := c.registryService()
	if err != nil {
		return nil, err
	}
	w, err := svc.GetWorker(ctx, &flov1.GetWorkerRequest{Namespace: c.namespace, WorkerId: id})
	if err != nil {
		return nil, fmt.Errorf("get worker %s: %w", id, err)
	}
	return workerFromProto(w), nil
}

// DrainWorker drains the worker id: it is handed no new task, finishes the ones it holds, then
// deregisters, and its Start returns. Draining cannot be undone; draining a draining worker
// changes nothing.
func (c *Client) DrainWorker(ctx context.Context, id string) (*Worker, error) {
	svc, err := c.registryService()
	if err != nil {
		return nil, err
	}
	w, err := svc.DrainWorker(ctx, &flov1.GetWorkerRequest{Namespace: c.namespace, WorkerId: id})
	if err != nil {
		return nil, fmt.Errorf("drain worker %s: %w", id, err)
	}
	return workerFromProto(w), nil
}

// DeregisterWorker removes the worker id's record, for example that of a worker that died and
// will not come back. Removing an unknown worker succeeds. A running worker that is removed
// registers again with its next heartbeat.
func (c *Client) DeregisterWorker(ctx context.Context, id string) error {
	svc, err := c.registryService()
	if err != nil {
		return err
	}
	if _, err := svc.DeregisterWorker(ctx, &flov1.GetWorkerRequest{Namespace: c.namespace, WorkerId: id}); err != nil {
		return fmt.Errorf("deregister worker %s: %w", id, err)
	}
	return nil
}

// register makes one attempt to create or replace the worker's record: its type,
// concurrency, processes, metadata and machine. When the gateway refuses it for being over
// its rate, retryAfter is how long it asked the worker to wait.
func (l *lifecycle) register(ctx context.Context) (retryAfter time.Duration, err error) {
	svc, err := l.client.registryService()
	if err != nil {
		return 0, err
	}
	workerType, processes := l.kind.registration()
	l.registered.Store(true)
	ctx, cancel := context.WithTimeout(ctx, registerAttemptTimeout)
	defer cancel()
	var trailer metadata.MD
	_, err = svc.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{
		Namespace:      l.client.namespace,
		WorkerId:       l.set.workerID,
		WorkerType:     workerType,
		MaxConcurrency: int32(l.set.concurrency),
		Processes:      processes,
		Metadata:       l.metadata,
		MachineId:      l.set.machineID,
	}, grpc.Trailer(&trailer))
	if err != nil {
		return retryAfterOf(trailer), fmt.Errorf("register worker: %w", err)
	}
	return 0, nil
}

// retryAfterOf is the wait a retry-after trailer asks for, zero without one.
func retryAfterOf(trailer metadata.MD) time.Duration {
	v := trailer.Get(retryAfterKey)
	if len(v) == 0 {
		return 0
	}
	seconds, err := strconv.Atoi(v[0])
	if err != nil || seconds <= 0 {
		return 0
	}
	return time.Duration(seconds) * time.Second
}

// registrationTransient reports whether a registration may succeed if tried again: the
// registry (or the gateway's way to it) is down or slow, or the gateway is overloaded and
// said when to come back (retryAfter). A ResourceExhausted without a retry-after is the
// namespace's worker limit, which holds until other workers leave: the worker is refused.
func registrationTransient(err error, retryAfter time.Duration) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	case codes.ResourceExhausted:
		return retryAfter > 0
	}
	return false
}

// keepRegistering carries on after a registration attempt failed with err (and retryAfter):
// it tries again with backoff while the failure is transient, until the registry takes the
// worker or refuses it, or the worker stops. The worker runs meanwhile: the registry is not on
// the task path. A refusal is logged; the next heartbeat finds no record and tries again.
func (l *lifecycle) keepRegistering(ctx context.Context, err error, retryAfter time.Duration) {
	delays := newBackoff(registerRetryMin, registerRetryMax)
	for failed := 1; ; failed++ {
		if !registrationTransient(err, retryAfter) {
			l.log.Warn("flo: the worker registry refused the worker; trying again with the next heartbeat", "error", err)
			return
		}
		if failed%warnEvery == 0 {
			l.log.Warn("flo: registering the worker keeps failing; the worker runs and keeps trying",
				"attempts", failed, "error", err)
		} else {
			l.log.Debug("flo: registering the worker failed; trying again", "attempts", failed, "error", err)
		}
		if !l.wait(ctx, max(delays.NextBackOff(), retryAfter)) {
			return
		}
		if retryAfter, err = l.register(ctx); err == nil {
			if failed >= warnEvery {
				l.log.Info("flo: worker registered", "attempts", failed+1)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// wait waits d, or less if the worker stops or ctx ends first, and reports whether it waited
// d.
func (l *lifecycle) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return !l.stopping.Load()
	case <-l.stopCh:
		return false
	case <-ctx.Done():
		return false
	}
}

// heartbeatLoop sends a heartbeat every HeartbeatInterval until ctx ends, which is when Start
// is about to return: a stopping worker still finishing its work keeps reporting its load.
func (l *lifecycle) heartbeatLoop(ctx context.Context) {
	ticker := time.NewTicker(l.set.heartbeatInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		l.heartbeat(ctx)
	}
}

var (
	// errNoBeatLine says no stream takes heartbeats now: none is up, or its gateway does not
	// (an older one); the heartbeat goes as a WorkerRegistryService call instead.
	errNoBeatLine = errors.New("no worker stream takes heartbeats")
	// errUnknownWorker is the registry saying it has no record of the worker.
	errUnknownWorker = errors.New("the worker registry does not know the worker")
)

// beatLine carries heartbeats on one worker stream whose gateway takes them: the heartbeat
// loop puts a Heartbeat in send for the stream's writer and waits for the reader to pass the
// HeartbeatAck on through acks; done is closed when the stream has ended.
type beatLine struct {
	send chan *flov1.WorkerMessage
	acks chan *flov1.HeartbeatAck
	done chan struct{}
}

func newBeatLine() *beatLine {
	return &beatLine{send: make(chan *flov1.WorkerMessage, 1), acks: make(chan *flov1.HeartbeatAck, 1), done: make(chan struct{})}
}

// heartbeat reports the number of running handlers and acts on the answer: draining drains the
// worker, an unknown worker registers again (its record was removed, or the registry never got
// the first registration), and anything else is logged (at Warn the first time and then every
// warnEvery failures in a row) and tried again next time. The heartbeat goes on the worker
// stream when its gateway takes heartbeats there, which costs the gateway and the registry far
// less than a call of its own, and as a WorkerRegistryService call otherwise.
func (l *lifecycle) heartbeat(ctx context.Context) {
	load := int32(l.slots.running())
	st, err := l.beatOnStream(ctx, load)
	if errors.Is(err, errNoBeatLine) {
		st, err = l.beatByCall(ctx, load)
	}
	switch {
	case err == nil:
		l.beatFailures = 0
		if st == flov1.WorkerStatus_WORKER_STATUS_DRAINING {
			l.drain("the registry says the worker is draining")
		}
	case ctx.Err() != nil:
	case errors.Is(err, errUnknownWorker):
		l.beatFailures = 0
		if l.stopping.Load() {
			return // on its way out; the record would only be removed again
		}
		l.log.Info("flo: the worker registry does not know this worker; registering again")
		if retryAfter, err := l.register(ctx); err != nil && ctx.Err() == nil {
			l.keepRegistering(ctx, err, retryAfter)
		}
	default:
		l.beatFailures++
		level := slog.LevelDebug
		if l.beatFailures == 1 || l.beatFailures%warnEvery == 0 {
			level = slog.LevelWarn
		}
		l.log.Log(ctx, level, "flo: heartbeat failed; retrying with the next one", "error", err, "failures", l.beatFailures)
	}
}

// beatOnStream sends a heartbeat on the current stream and waits for its answer. It returns
// errNoBeatLine when no stream takes heartbeats, or the stream ended before it answered.
func (l *lifecycle) beatOnStream(ctx context.Context, load int32) (flov1.WorkerStatus, error) {
	line := l.beats.Load()
	if line == nil {
		return 0, errNoBeatLine
	}
	select {
	case <-line.acks: // the late answer to an earlier heartbeat
	default:
	}
	timeout := time.NewTimer(registryCallTimeout)
	defer timeout.Stop()
	msg := &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Heartbeat{Heartbeat: &flov1.Heartbeat{CurrentLoad: load}}}
	select {
	case line.send <- msg:
	case <-line.done:
		return 0, errNoBeatLine
	case <-timeout.C:
		return 0, errors.New("heartbeat: the worker stream did not take it in time")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case ack := <-line.acks:
		switch {
		case ack.GetUnknown():
			return 0, errUnknownWorker
		case ack.GetError() != "":
			return 0, fmt.Errorf("heartbeat: %s", ack.GetError())
		}
		return ack.GetStatus(), nil
	case <-line.done:
		return 0, errNoBeatLine
	case <-timeout.C:
		return 0, errors.New("heartbeat: no answer on the worker stream in time")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// beatByCall sends a heartbeat as a WorkerRegistryService call.
func (l *lifecycle) beatByCall(ctx context.Context, load int32) (flov1.WorkerStatus, error) {
	svc, err := l.client.registryService()
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, registryCallTimeout)
	defer cancel()
	resp, err := svc.Heartbeat(cctx, &flov1.HeartbeatRequest{
		Namespace:   l.client.namespace,
		WorkerId:    l.set.workerID,
		CurrentLoad: load,
	})
	switch {
	case status.Code(err) == codes.NotFound:
		return 0, errUnknownWorker
	case err != nil:
		return 0, err
	}
	return resp.GetStatus(), nil
}

// deregister removes the worker's record once, when Start ends. A failure is logged: the
// registry marks the silent worker unhealthy and an operator can remove it.
func (l *lifecycle) deregister() {
	if !l.registered.CompareAndSwap(true, false) {
		return
	}
	svc, err := l.client.registryService()
	if err != nil {
		l.log.Warn("flo: could not deregister the worker", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(l.base, registryCallTimeout)
	defer cancel()
	if _, err := svc.DeregisterWorker(ctx, &flov1.GetWorkerRequest{Namespace: l.client.namespace, WorkerId: l.set.workerID}); err != nil {
		l.log.Warn("flo: could not deregister the worker", "error", err)
	}
}
