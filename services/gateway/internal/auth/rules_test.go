package auth

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// publicMethods are the methods of every service in package flo.v1, read
// from the registered file descriptors, so a new file or method shows up
// here without anyone listing it.
func publicMethods(t *testing.T) map[string]protoreflect.MethodDescriptor {
	t.Helper()
	_ = flov1.File_flo_v1_api_proto // registers the package's files
	methods := map[string]protoreflect.MethodDescriptor{}
	protoregistry.GlobalFiles.RangeFilesByPackage(protoPackage, func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				methods["/"+string(svc.FullName())+"/"+string(m.Name())] = m
			}
		}
		return true
	})
	require.NotEmpty(t, methods)
	return methods
}

func TestEveryPublicMethodHasARule(t *testing.T) {
	t.Parallel()
	methods := publicMethods(t)
	for name, m := range methods {
		rule, ok := rules[name]
		if !ok {
			t.Errorf("%s has no rule in auth.rules: every public method needs one", name)
			continue
		}
		if m.IsStreamingClient() || m.IsStreamingServer() {
			require.Empty(t, rule.NamespaceField, "%s streams: its handler checks the namespace with auth.Check", name)
			continue
		}
		if rule.NamespaceField == "" {
			require.True(t, rule.AnyKey || len(rule.Roles) == 0, "%s: a rule for a role in a namespace names the namespace field", name)
			continue
		}
		fd := m.Input().Fields().ByName(protoreflect.Name(rule.NamespaceField))
		require.NotNil(t, fd, "%s: request %s has no field %q", name, m.Input().FullName(), rule.NamespaceField)
		require.Equal(t, protoreflect.StringKind, fd.Kind(), "%s: %s is not a string", name, rule.NamespaceField)
	}
	for name := range rules {
		require.Contains(t, methods, name, "rule for a method that does not exist")
	}
}

func TestEveryRouteCarriesItsNamespace(t *testing.T) {
	t.Parallel()
	routes, err := restRoutes()
	require.NoError(t, err)
	require.NotEmpty(t, routes)
	methods := publicMethods(t)
	param := regexp.MustCompile(`\{([^}]+)\}`)
	for r, op := range routes {
		method := op.fullMethod
		require.Contains(t, methods, method, "%s %s calls an unknown method", r.method, op.path)
		rule, ok := rules[method]
		require.True(t, ok, "%s %s (%s) has no rule", r.method, op.path, method)
		if rule.NamespaceField == "" {
			continue
		}
		var params []string
		for _, m := range param.FindAllStringSubmatch(op.path, -1) {
			params = append(params, m[1])
		}
		require.Contains(t, params, rule.NamespaceField,
			"%s %s (%s): its rule takes the namespace from {%s}, which the path lacks", r.method, op.path, method, rule.NamespaceField)
	}
}

func TestRouteOfPattern(t *testing.T) {
	t.Parallel()
	require.Equal(t, routeOf("post", "/v1/keys/{id}:revoke"), routeOf("POST", "/v1/keys/{id=*}:revoke"))
	require.Equal(t, routeOf("get", "/v1/namespaces/{namespace}/tasks/{taskId}"),
		routeOf("GET", "/v1/namespaces/{namespace=*}/tasks/{task_id=*}"))
}

func TestAllow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    Principal
		rule Rule
		ns   string
		ok   bool
	}{
		{name: "admin, admin-only rule", p: Principal{Role: RoleAdmin}, rule: adminOnly, ok: true},
		{name: "client, admin-only rule", p: Principal{Role: RoleClient, Namespace: "a"}, rule: adminOnly},
		{name: "any key", p: Principal{Role: RoleRead, Namespace: "a"}, rule: anyKey, ok: true},
		{name: "role and namespace", p: Principal{Role: RoleRead, Namespace: "a"}, rule: reader, ns: "a", ok: true},
		{name: "other namespace", p: Principal{Role: RoleRead, Namespace: "a"}, rule: reader, ns: "b"},
		{name: "no namespace named", p: Principal{Role: RoleRead, Namespace: "a"}, rule: reader},
		{name: "a non-admin key without a namespace", p: Principal{Role: RoleClient}, rule: client},
		{name: "unknown role", p: Principal{Role: "owner", Namespace: "a"}, rule: client, ns: "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rule.allow(tc.p, "/m", tc.ns)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		})
	}
}
