// Package proto holds Flo's protobuf sources and the Go generated from them
// (under gen/), and embeds the OpenAPI document of the REST facade.
package proto

import _ "embed"

// OpenAPI is the OpenAPI (Swagger 2.0) document of the REST API under /v1.
//
//go:embed gen/flo.swagger.json
var OpenAPI []byte
