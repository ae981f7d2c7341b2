package flo

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Retries of calls the gateway answered UNAVAILABLE (the service behind it
// restarting, say): attempts in all, and the backoff between them, which
// doubles up to the maximum (gRPC waits a random time up to it, retryKeyed
// the backoff ±20%: at most about 1.5 s and 1.8 s over the four retries).
const (
	retryAttempts   = 5
	retryBackoff    = 100 * time.Millisecond
	retryMaxBackoff = time.Second
)

// retriedMethods are the calls that are safe to send again: they read, or
// setting the same state twice is setting it once. Invocations, appends,
// starts, signals, creates and deletes are not in it: a call that reached
// the gateway before the connection broke may have taken effect, and
// repeating it could do it twice. An invocation or start with an idempotency
// key names one task or run however often it is sent, so retryKeyed retries
// those the same way.
var retriedMethods = map[string][]string{
	flov1.NamespaceService_ServiceDesc.ServiceName:      {"GetNamespace", "ListNamespaces"},
	flov1.ActionService_ServiceDesc.ServiceName:         {"GetAction", "ListActions", "EnableAction", "DisableAction"},
	flov1.TaskService_ServiceDesc.ServiceName:           {"GetTask", "AwaitTask", "ListDeadLetters"},
	flov1.WorkerRegistryService_ServiceDesc.ServiceName: {"GetWorker", "ListWorkers", "DrainWorker"},
	flov1.StreamService_ServiceDesc.ServiceName:         {"GetStream", "ListStreams", "Read", "ListGroups", "ListPending", "Ack"},
	flov1.WorkflowService_ServiceDesc.ServiceName: {
		"ValidateWorkflow", "GetWorkflow", "ListWorkflows", "DisableWorkflow", "EnableWorkflow",
		"GetRun", "ListRuns", "GetRunHistory", "CancelRun", "GetWorkflowPlans",
	},
}

// serviceConfig is the gRPC service config that retries retriedMethods.
func serviceConfig() string {
	type name struct {
		Service string `json:"service"`
		Method  string `json:"method"`
	}
	type retryPolicy struct {
		MaxAttempts          int      `json:"maxAttempts"`
		InitialBackoff       string   `json:"initialBackoff"`
		MaxBackoff           string   `json:"maxBackoff"`
		BackoffMultiplier    float64  `json:"backoffMultiplier"`
		RetryableStatusCodes []string `json:"retryableStatusCodes"`
	}
	type methodConfig struct {
		Name        []name      `json:"name"`
		RetryPolicy retryPolicy `json:"retryPolicy"`
	}
	mc := methodConfig{RetryPolicy: retryPolicy{
		MaxAttempts: retryAttempts, InitialBackoff: seconds(retryBackoff), MaxBackoff: seconds(retryMaxBackoff),
		BackoffMultiplier: 2, RetryableStatusCodes: []string{"UNAVAILABLE"},
	}}
	for service, methods := range retriedMethods {
		for _, m := range methods {
			mc.Name = append(mc.Name, name{Service: service, Method: m})
		}
	}
	// Strings and numbers only: encoding cannot fail.
	b, _ := json.Marshal(map[string][]methodConfig{"methodConfig": {mc}})
	return string(b)
}

// seconds formats d as a service config duration ("0.1s").
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// retryKeyed calls call, and when key is not empty calls it again while the
// gateway answers UNAVAILABLE, as the service config retries safe calls: up
// to retryAttempts in all, with a doubling backoff in between. A call with a
// key names one task or run however often it is sent, so repeating it
// cannot do it twice. It returns the last answer, also when ctx ends first.
func retryKeyed[T any](ctx context.Context, key string, call func() (T, error)) (T, error) {
	if key == "" {
		return call()
	}
	var (
		v   T
		err error
	)
	_, _ = backoff.Retry(ctx, func() (struct{}, error) {
		v, err = call()
		if err != nil && status.Code(err) != codes.Unavailable {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(newBackoff(retryBackoff, retryMaxBackoff)), backoff.WithMaxTries(retryAttempts), backoff.WithMaxElapsedTime(0))
	return v, err
}

// newBackoff is every wait between attempts in the SDK: from initial,
// doubling up to ceiling, each drawn from ±20% of its nominal value so
// clients that failed together do not come back together. It is the shape
// of the server's retry policies (libs/retry), on the same library.
func newBackoff(initial, ceiling time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     initial,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         ceiling,
	}
	b.Reset()
	return b
}
