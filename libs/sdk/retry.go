package flo

import (
	"encoding/json"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Retries of calls the gateway answered UNAVAILABLE (the service behind it
// restarting, say): attempts in all, and the backoff between them (gRPC
// waits a random time up to the backoff, which doubles, so at most about
// 1.5 s over the four retries).
const (
	retryAttempts   = 5
	retryBackoff    = "0.1s"
	retryMaxBackoff = "1s"
)

// retriedMethods are the calls that are safe to send again: they read, or
// setting the same state twice is setting it once. Invocations, appends,
// starts, signals, creates and deletes are not in it: a call that reached
// the gateway before the connection broke may have taken effect, and
// repeating it could do it twice (invoke or start with an idempotency key to
// retry those safely).
var retriedMethods = map[string][]string{
	flov1.NamespaceService_ServiceDesc.ServiceName:      {"GetNamespace", "ListNamespaces"},
	flov1.ActionService_ServiceDesc.ServiceName:         {"GetAction", "ListActions", "EnableAction", "DisableAction"},
	flov1.TaskService_ServiceDesc.ServiceName:           {"GetTask", "AwaitTask", "ListDeadLetters"},
	flov1.WorkerRegistryService_ServiceDesc.ServiceName: {"GetWorker", "ListWorkers", "DrainWorker"},
	flov1.StreamService_ServiceDesc.ServiceName:         {"GetStream", "ListStreams", "Read", "ListGroups", "ListPending", "Ack"},
	flov1.WorkflowService_ServiceDesc.ServiceName: {
		"ValidateWorkflow", "GetWorkflow", "ListWorkflows", "DisableWorkflow", "EnableWorkflow",
		"GetRun", "ListRuns", "GetRunHistory", "CancelRun",
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
		MaxAttempts: retryAttempts, InitialBackoff: retryBackoff, MaxBackoff: retryMaxBackoff,
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
