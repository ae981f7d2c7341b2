package auth

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	floproto "github.com/razorbill/flo/proto"
)

// route is a REST route: an HTTP method and a path template whose
// parameters are all written {}, such as /v1/namespaces/{}/tasks/{}, since
// the OpenAPI document names them in camelCase (taskId) and grpc-gateway's
// patterns as the fields are named ({task_id=*}).
type route struct {
	method string
	path   string
}

// operation is what a route calls: a gRPC full method, and the route's
// path as the OpenAPI document writes it.
type operation struct {
	fullMethod string
	path       string
}

// protoPackage is the package of the public services; OpenAPI operation ids
// name a method as <Service>_<Method> within it.
const protoPackage = "flo.v1"

// restRoutes maps every REST route to the gRPC full method it calls, read
// from the OpenAPI document, which is generated from the same HTTP rules
// (proto/flo/v1/api_http.yaml) as the grpc-gateway routes, so the two
// cannot disagree.
func restRoutes() (map[route]operation, error) {
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(floproto.OpenAPI, &doc); err != nil {
		return nil, fmt.Errorf("decode OpenAPI document: %w", err)
	}
	routes := make(map[route]operation)
	for path, ops := range doc.Paths {
		for method, op := range ops {
			svc, name, ok := strings.Cut(op.OperationID, "_")
			if !ok {
				return nil, fmt.Errorf("operation %q of %s %s does not name a service method", op.OperationID, method, path)
			}
			r := routeOf(method, path)
			if prev, dup := routes[r]; dup {
				return nil, fmt.Errorf("%s %s and %s match the same requests", method, path, prev.path)
			}
			routes[r] = operation{fullMethod: "/" + protoPackage + "." + svc + "/" + name, path: path}
		}
	}
	return routes, nil
}

// paramRE matches a path parameter: {taskId} in the OpenAPI document,
// {task_id=*} in a grpc-gateway pattern's String().
var paramRE = regexp.MustCompile(`\{[^}]*\}`)

// routeOf returns the route of a method and a path template of either form.
func routeOf(method, path string) route {
	return route{method: strings.ToUpper(method), path: paramRE.ReplaceAllString(path, "{}")}
}
