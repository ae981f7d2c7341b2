package auth

import (
	"context"
	"maps"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// Rule says who may call a method. An admin key may call every method; a
// key of another role only a method whose rule lists its role, and only in
// the key's own namespace.
type Rule struct {
	// Roles besides admin that may call the method; none means admin only.
	Roles []Role
	// AnyKey lets every valid key call the method, in no namespace
	// (ListNamespaces, which filters what it shows).
	AnyKey bool
	// NamespaceField names the request field (and REST path parameter)
	// holding the call's namespace. Empty with Roles set means the handler
	// checks the namespace itself with Check (the worker stream, whose
	// namespace comes in its first message).
	NamespaceField string
}

var (
	adminOnly = Rule{}
	anyKey    = Rule{AnyKey: true}
	// reader, client and worker are the rules of calls made in the
	// request's namespace field.
	reader       = Rule{Roles: []Role{RoleRead, RoleClient}, NamespaceField: "namespace"}
	client       = Rule{Roles: []Role{RoleClient}, NamespaceField: "namespace"}
	worker       = Rule{Roles: []Role{RoleWorker}, NamespaceField: "namespace"}
	readerWorker = Rule{Roles: []Role{RoleRead, RoleClient, RoleWorker}, NamespaceField: "namespace"}
	clientWorker = Rule{Roles: []Role{RoleClient, RoleWorker}, NamespaceField: "namespace"}
)

// Rules returns a copy of the permission of every public method, by gRPC
// full method.
func Rules() map[string]Rule { return maps.Clone(rules) }

// rules is the permission of every public method, by gRPC full method. A
// method missing here is refused, and a test fails for it.
var rules = map[string]Rule{
	flov1.NamespaceService_CreateNamespace_FullMethodName: adminOnly,
	flov1.NamespaceService_GetNamespace_FullMethodName:    {Roles: reader.Roles, NamespaceField: "name"},
	flov1.NamespaceService_ListNamespaces_FullMethodName:  anyKey,

	flov1.KeyService_CreateKey_FullMethodName: adminOnly,
	flov1.KeyService_ListKeys_FullMethodName:  adminOnly,
	flov1.KeyService_RevokeKey_FullMethodName: adminOnly,

	flov1.ActionService_RegisterAction_FullMethodName: client,
	flov1.ActionService_GetAction_FullMethodName:      reader,
	flov1.ActionService_ListActions_FullMethodName:    reader,
	flov1.ActionService_EnableAction_FullMethodName:   client,
	flov1.ActionService_DisableAction_FullMethodName:  client,

	flov1.TaskService_InvokeTask_FullMethodName:        client,
	flov1.TaskService_InvokeTasks_FullMethodName:       client,
	flov1.TaskService_GetTask_FullMethodName:           reader,
	flov1.TaskService_AwaitTask_FullMethodName:         reader,
	flov1.TaskService_ListDeadLetters_FullMethodName:   reader,
	flov1.TaskService_RequeueDeadLetter_FullMethodName: client,
	flov1.TaskService_CompleteTask_FullMethodName:      client,
	flov1.TaskService_FailTask_FullMethodName:          client,

	// Workers register, heartbeat and deregister themselves (the SDK's
	// worker lifecycle); draining one is an operator's call.
	flov1.WorkerRegistryService_RegisterWorker_FullMethodName:   worker,
	flov1.WorkerRegistryService_Heartbeat_FullMethodName:        worker,
	flov1.WorkerRegistryService_GetWorker_FullMethodName:        reader,
	flov1.WorkerRegistryService_ListWorkers_FullMethodName:      reader,
	flov1.WorkerRegistryService_DrainWorker_FullMethodName:      client,
	flov1.WorkerRegistryService_DeregisterWorker_FullMethodName: worker,

	flov1.WorkerService_Stream_FullMethodName: {Roles: []Role{RoleWorker}},

	flov1.StreamService_CreateStream_FullMethodName: client,
	flov1.StreamService_GetStream_FullMethodName:    reader,
	flov1.StreamService_ListStreams_FullMethodName:  reader,
	flov1.StreamService_DeleteStream_FullMethodName: client,
	flov1.StreamService_Append_FullMethodName:       client,
	flov1.StreamService_Read_FullMethodName:         readerWorker,
	// A stream worker creates its group when it starts (the SDK's
	// StreamWorker.prepare).
	flov1.StreamService_CreateGroup_FullMethodName: clientWorker,
	flov1.StreamService_ListGroups_FullMethodName:  reader,
	flov1.StreamService_DeleteGroup_FullMethodName: client,
	flov1.StreamService_ListPending_FullMethodName: reader,
	flov1.StreamService_GroupRead_FullMethodName:   worker,
	flov1.StreamService_Ack_FullMethodName:         worker,
	flov1.StreamService_Nack_FullMethodName:        worker,

	flov1.WorkflowService_CreateWorkflow_FullMethodName:      client,
	flov1.WorkflowService_ValidateWorkflow_FullMethodName:    reader,
	flov1.WorkflowService_GetWorkflow_FullMethodName:         reader,
	flov1.WorkflowService_ListWorkflows_FullMethodName:       reader,
	flov1.WorkflowService_DisableWorkflow_FullMethodName:     client,
	flov1.WorkflowService_EnableWorkflow_FullMethodName:      client,
	flov1.WorkflowService_StartRun_FullMethodName:            client,
	flov1.WorkflowService_GetRun_FullMethodName:              reader,
	flov1.WorkflowService_ListRuns_FullMethodName:            reader,
	flov1.WorkflowService_SignalRun_FullMethodName:           client,
	flov1.WorkflowService_CancelRun_FullMethodName:           client,
	flov1.WorkflowService_GetRunHistory_FullMethodName:       reader,
	flov1.WorkflowService_GetWorkflowPlans_FullMethodName:    reader,
	flov1.WorkflowService_InvalidatePlanCache_FullMethodName: client,
	flov1.WorkflowService_ListSchedules_FullMethodName:       reader,
}

// allow says whether p may make a call under rule in namespace ns, as a
// PermissionDenied status when not.
func (r Rule) allow(p Principal, method, ns string) error {
	switch {
	case p.Role == RoleAdmin || r.AnyKey:
		return nil
	case !slices.Contains(r.Roles, p.Role):
		return status.Errorf(codes.PermissionDenied, "a %s key may not call %s", p.Role, method)
	case p.Namespace == "":
		// Only admin keys lack a namespace; a stored key that breaks that
		// rule must not match calls that name none.
		return status.Errorf(codes.PermissionDenied, "key %s has no namespace", p.KeyID)
	case ns != p.Namespace:
		return status.Errorf(codes.PermissionDenied, "key %s acts in namespace %q, not %q", p.KeyID, p.Namespace, ns)
	}
	return nil
}

// namespaceOf reads the rule's namespace field of a request message.
func (r Rule) namespaceOf(req any) string {
	m, ok := req.(proto.Message)
	if !ok || r.NamespaceField == "" {
		return ""
	}
	msg := m.ProtoReflect()
	fd := msg.Descriptor().Fields().ByName(protoreflect.Name(r.NamespaceField))
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return ""
	}
	return msg.Get(fd).String()
}

// Check says whether the caller in ctx may make a call of fullMethod in
// namespace ns, for handlers that learn the namespace after the
// interceptor ran (the worker stream's Hello). It answers PermissionDenied
// (Unauthenticated without a principal).
func Check(ctx context.Context, fullMethod, ns string) error {
	p, ok := FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	rule, ok := rules[fullMethod]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no permission rule", fullMethod)
	}
	return rule.allow(p, fullMethod, ns)
}
