package deploy_test

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/config"
	dispatcher "github.com/razorbill/flo/services/dispatcher/service"
	gateway "github.com/razorbill/flo/services/gateway/service"
	registry "github.com/razorbill/flo/services/registry/service"
	streams "github.com/razorbill/flo/services/streams/service"
	workflow "github.com/razorbill/flo/services/workflow/service"
)

// floService is what the deploy files need to know about one service binary.
type floService struct {
	// serve returns a new pointer to what its main loads with config.Load
	// to serve: the service's Config and config.Log.
	serve func() any
	// schema says whether the service keeps a Postgres schema, so it has a
	// migrate step.
	schema bool
}

// serveConfig is the shape of every service main's configuration: the
// service's Config and the shared log setting.
type serveConfig[C any] struct {
	Service C
	Log     config.Log
}

// floServices are the service binaries, by the name the deploy files use
// (build arg SERVICE, image flo-<name>).
var floServices = map[string]floService{
	"gateway":    {serve: func() any { return new(serveConfig[gateway.Config]) }},
	"dispatcher": {serve: func() any { return new(serveConfig[dispatcher.Config]) }, schema: true},
	"registry":   {serve: func() any { return new(serveConfig[registry.Config]) }, schema: true},
	"streams":    {serve: func() any { return new(serveConfig[streams.Config]) }, schema: true},
	"workflow":   {serve: func() any { return new(serveConfig[workflow.Config]) }, schema: true},
}

// allFive are the services every deploy file must run.
var allFive = []string{"gateway", "dispatcher", "registry", "streams", "workflow"}

// migrateConfig is what `<service> migrate` reads.
func migrateConfig() any { return new(cmdline.MigrateConfig) }

// envNames lists the variables named in the env tags of cfg's struct type,
// nested structs (config.Postgres, config.Kafka, ...) included.
func envNames(cfg any) map[string]bool {
	names := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			if tag, ok := f.Tag.Lookup("env"); ok {
				names[strings.TrimSpace(strings.Split(tag, ",")[0])] = true
				continue
			}
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeOf(cfg).Elem())
	return names
}

// otherVarAllowed reports whether a deploy file may set name outside FLO_*:
// the OpenTelemetry SDK's variables and the Go runtime's.
func otherVarAllowed(name string) bool {
	return strings.HasPrefix(name, "OTEL_") || slices.Contains([]string{"GOMAXPROCS", "GOMEMLIMIT", "GODEBUG"}, name)
}

// advertiseSuffix ends the variable of the address a service's replicas
// reach each other at (FLO_DISPATCHER_ADVERTISE_ADDR).
const advertiseSuffix = "_ADVERTISE_ADDR"

// peerAddr reports whether key names a peer's internal API, such as
// FLO_DISPATCHER_ADDR, rather than an address of the service itself
// (FLO_<SERVICE>_GRPC_ADDR, _HTTP_ADDR, _METRICS_ADDR, and _ADVERTISE_ADDR,
// where its own replicas reach it).
func peerAddr(key string) bool {
	if !strings.HasSuffix(key, "_ADDR") {
		return false
	}
	for _, own := range []string{"_GRPC_ADDR", "_HTTP_ADDR", "_METRICS_ADDR", advertiseSuffix} {
		if strings.HasSuffix(key, own) {
			return false
		}
	}
	return true
}

// envProblems lists every variable in env that cfg (a pointer to a config
// struct) does not read, and values it cannot parse, filling cfg from env and
// defaults.
func envProblems(cfg any, env map[string]string) []string {
	return append(nameProblems(cfg, sortedKeys(env)), valueProblems(cfg, env)...)
}

// nameProblems lists the variables among names that cfg does not read.
func nameProblems(cfg any, names []string) []string {
	var problems []string
	known := envNames(cfg)
	for _, name := range names {
		switch {
		case known[name]:
		case strings.HasPrefix(name, "FLO_"):
			problems = append(problems, fmt.Sprintf("%s is not read by its config (it reads %s)", name, strings.Join(sortedKeys(known), ", ")))
		case !otherVarAllowed(name):
			problems = append(problems, fmt.Sprintf("%s is neither a FLO_* nor an OTEL_* variable", name))
		}
	}
	return problems
}

// valueProblems fills cfg from env and defaults and says why it could not.
func valueProblems(cfg any, env map[string]string) []string {
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: cfg, Lookuper: envconfig.MapLookuper(env)}); err != nil {
		return []string{fmt.Sprintf("values do not parse: %v", err)}
	}
	return nil
}

// checkEnv fails t with envProblems; where names the file and service.
func checkEnv(t *testing.T, where string, cfg any, env map[string]string) {
	t.Helper()
	for _, p := range envProblems(cfg, env) {
		t.Errorf("%s: %s", where, p)
	}
}

// field returns the value of the field called name anywhere in cfg's
// struct (GRPCAddr, HTTPAddr, BootstrapNamespaces), or nil.
func field(cfg any, name string) any {
	var find func(v reflect.Value) any
	find = func(v reflect.Value) any {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			if sf.Name == name {
				return f.Interface()
			}
			if f.Kind() == reflect.Struct {
				if found := find(f); found != nil {
					return found
				}
			}
		}
		return nil
	}
	return find(reflect.ValueOf(cfg).Elem())
}

// stringField returns field(cfg, name) when it is a string, else "".
func stringField(cfg any, name string) string {
	s, _ := field(cfg, name).(string)
	return s
}

// port returns the port of a listen or dial address (":9101",
// "dispatcher:9101").
func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err, "address %q", addr)
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestEnvNamesSeeNestedConfigs(t *testing.T) {
	t.Parallel()
	names := envNames(floServices["dispatcher"].serve())
	for _, want := range []string{"FLO_DISPATCHER_GRPC_ADDR", "FLO_DATABASE_URL", "FLO_KAFKA_BROKERS", "FLO_LOG_LEVEL"} {
		require.True(t, names[want], "dispatcher config reads %s", want)
	}
	require.False(t, names["FLO_GATEWAY_GRPC_ADDR"])
	require.Equal(t, map[string]bool{"FLO_DATABASE_URL": true, "FLO_DATABASE_MAX_CONNS": true, "FLO_LOG_LEVEL": true}, envNames(migrateConfig()))
}

func TestEnvProblemsCatchUnknownNamesAndBadValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "misspelt variable", env: map[string]string{"FLO_DISPATCHER_ADRR": "x:1"}, want: "FLO_DISPATCHER_ADRR is not read"},
		{name: "another service's variable", env: map[string]string{"FLO_GATEWAY_HTTP_ADDR": ":1"}, want: "FLO_GATEWAY_HTTP_ADDR is not read"},
		{name: "foreign variable", env: map[string]string{"DATABASE_URL": "x"}, want: "neither a FLO_*"},
		{name: "bad duration", env: map[string]string{"FLO_SHUTDOWN_DELAY": "soon"}, want: "values do not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			problems := envProblems(floServices["dispatcher"].serve(), tc.env)
			require.Len(t, problems, 1)
			require.Contains(t, problems[0], tc.want)
		})
	}
	require.Empty(t, envProblems(floServices["dispatcher"].serve(), map[string]string{
		"FLO_SHUTDOWN_DELAY": "2s", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
	}))
}
