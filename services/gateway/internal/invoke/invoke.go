// Package invoke turns an invocation into an InvokeTask command on the log.
// The gateway answers the caller only after the broker has acknowledged the
// record, so a task id a client holds always refers to a command that will be
// applied; concurrent invocations share produce batches in the client.
package invoke

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

// idempotencySpace is the UUID namespace of task ids derived from idempotency
// keys. It is itself derived from a fixed name so anyone can recompute it.
var idempotencySpace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/razorbill/flo/idempotency-key"))

// Command is one validated invocation.
type Command struct {
	Namespace      string
	Action         string
	Payload        []byte
	IdempotencyKey string
	Priority       int32
	Delay          time.Duration
	// TraceContext is the W3C trace context of the invocation's caller when
	// it is not the call's own (a batch gathered from many callers); empty
	// means the call's.
	TraceContext map[string]string
}

// produceTimeout bounds the wait for the broker's acknowledgement. franz-go
// fails a record on timeout only while that is safe (it was not sent), so a
// timed-out invocation was not queued and may be retried. The caller's own
// cancellation is not passed on: franz-go fails every buffered record of a
// partition when the first one's context ends, which would fail other
// callers' invocations because one client went away.
const produceTimeout = 30 * time.Second

// Producer writes commands to the log.
type Producer struct {
	client *kgo.Client
	now    func() time.Time
}

// NewProducer returns a Producer writing through client.
func NewProducer(client *kgo.Client) *Producer {
	return &Producer{client: client, now: time.Now}
}

// Invoke produces the command and waits for the broker's acknowledgement. It
// returns the task id: a new UUIDv7, or the id derived from the idempotency
// key so that the same key always names the same task.
func (p *Producer) Invoke(ctx context.Context, cmd Command) (string, error) {
	ids, err := p.InvokeMany(ctx, []Command{cmd})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// InvokeMany produces every command at once, so they share produce batches,
// and waits for all acknowledgements. It returns the task ids in command
// order, or the first error. On error some commands may still have been
// queued: the records of other partitions are not taken back, so a caller
// retrying a failed batch should use idempotency keys.
func (p *Producer) InvokeMany(ctx context.Context, cmds []Command) ([]string, error) {
	ids := make([]string, len(cmds))
	records := make([]*kgo.Record, len(cmds))
	now := p.now()
	// The call's trace headers, made once and shared (read-only) by every
	// command that carries no trace context of its own.
	var (
		callTrace []kgo.RecordHeader
		traced    bool
	)
	for i, cmd := range cmds {
		rec, taskID, err := newRecord(cmd, now)
		if err != nil {
			return nil, err
		}
		switch {
		case len(cmd.TraceContext) > 0:
			kafka.InjectTrace(kafka.ContextFromHeaders(ctx, cmd.TraceContext), rec)
		case !traced:
			kafka.InjectTrace(ctx, rec)
			callTrace, traced = slices.Clip(rec.Headers), true
		default:
			rec.Headers = callTrace
		}
		ids[i], records[i] = taskID, rec
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), produceTimeout)
	defer cancel()
	if err := p.client.ProduceSync(pctx, records...).FirstErr(); err != nil {
		if len(cmds) == 1 {
			return nil, fmt.Errorf("produce invoke command for task %s: %w", ids[0], err)
		}
		return nil, fmt.Errorf("produce %d invoke commands: %w", len(cmds), err)
	}
	return ids, nil
}

// newRecord encodes one command as its log record, without trace headers,
// and returns it with the task id.
func newRecord(cmd Command, now time.Time) (*kgo.Record, string, error) {
	taskID, err := NewTaskID(cmd.Namespace, cmd.Action, cmd.IdempotencyKey)
	if err != nil {
		return nil, "", err
	}
	value, err := (&eventsv1.InvokeTask{
		EventId:        kafka.NewEventID().String(),
		TaskId:         taskID,
		Namespace:      cmd.Namespace,
		Action:         cmd.Action,
		Payload:        cmd.Payload,
		IdempotencyKey: cmd.IdempotencyKey,
		Priority:       cmd.Priority,
		InvokedAt:      timestamppb.New(now),
		RunAt:          timestamppb.New(now.Add(cmd.Delay)),
	}).MarshalVT()
	if err != nil {
		return nil, "", fmt.Errorf("encode invoke command: %w", err)
	}
	// Stamped with the call's time, which franz-go would read again per record.
	return &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(taskID), Value: value, Timestamp: now}, taskID, nil
}

// NewTaskID returns the id of a new task: derived from the idempotency key
// when there is one, a time-ordered UUIDv7 otherwise.
func NewTaskID(namespace, action, idempotencyKey string) (string, error) {
	if idempotencyKey != "" {
		return uuid.NewSHA1(idempotencySpace, []byte(namespace+"\x00"+action+"\x00"+idempotencyKey)).String(), nil
	}
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("new task id: %w", err)
	}
	return id.String(), nil
}
