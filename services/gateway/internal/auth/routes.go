package auth

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	floproto "github.com/razorbill/flo/proto"
)

// route is a REST route as the OpenAPI document writes it: an HTTP method
// and a path template such as /v1/namespaces/{namespace}/tasks/{task_id}.
type route struct {
	method string
	path   string
}

// protoPackage is the package of the public services; OpenAPI operation ids
// name a method as <Service>_<Method> within it.
const protoPackage = "flo.v1"

// restRoutes maps every REST route to the gRPC full method it calls, read
// from the OpenAPI document, which is generated from the same HTTP rules
// (proto/flo/v1/api_http.yaml) as the grpc-gateway routes, so the two
// cannot disagree.
func restRoutes() (map[route]string, error) {
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(floproto.OpenAPI, &doc); err != nil {
		return nil, fmt.Errorf("decode OpenAPI document: %w", err)
	}
	routes := make(map[route]string)
	for path, ops := range doc.Paths {
		for method, op := range ops {
			svc, name, ok := strings.Cut(op.OperationID, "_")
			if !ok {
				return nil, fmt.Errorf("operation %q of %s %s does not name a service method", op.OperationID, method, path)
			}
			routes[route{method: strings.ToUpper(method), path: path}] = "/" + protoPackage + "." + svc + "/" + name
		}
	}
	return routes, nil
}

// captureRE matches a grpc-gateway capture such as {namespace=*}.
var captureRE = regexp.MustCompile(`\{([^=}]+)=\*\}`)

// routeOf returns the OpenAPI form of a matched grpc-gateway pattern, whose
// String() writes captures as {name=*}.
func routeOf(method, pattern string) route {
	return route{method: method, path: captureRE.ReplaceAllString(pattern, "{$1}")}
}
