package deploy_test

import (
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const composePath = "compose/docker-compose.yaml"

// composeFile is the part of a compose file the checks read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string          `yaml:"image"`
	Build       *composeBuild   `yaml:"build"`
	Command     composeStrings  `yaml:"command"`
	Environment composeEnv      `yaml:"environment"`
	DependsOn   composeDepends  `yaml:"depends_on"`
	NetworkMode string          `yaml:"network_mode"`
	Healthcheck *composeHealthz `yaml:"healthcheck"`
	Ports       []string        `yaml:"ports"`
}

type composeBuild struct {
	Context    string            `yaml:"context"`
	Dockerfile string            `yaml:"dockerfile"`
	Args       map[string]string `yaml:"args"`
}

type composeHealthz struct {
	Test composeStrings `yaml:"test"`
}

// composeStrings is a command or test: a list, or one string split on
// spaces as compose does.
type composeStrings []string

func (s *composeStrings) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = strings.Fields(n.Value)
		return nil
	}
	var list []string
	if err := n.Decode(&list); err != nil {
		return err
	}
	*s = list
	return nil
}

// composeEnv is an environment given as a map or as a list of NAME=value.
type composeEnv map[string]string

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	*e = composeEnv{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, item := range list {
			name, value, _ := strings.Cut(item, "=")
			(*e)[name] = value
		}
		return nil
	}
	var m map[string]string
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		(*e)[k] = v
	}
	return nil
}

// composeDepends maps a dependency to its condition, from the list or the
// long form ("service_started" for the list form).
type composeDepends map[string]string

func (d *composeDepends) UnmarshalYAML(n *yaml.Node) error {
	*d = composeDepends{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, name := range list {
			(*d)[name] = "service_started"
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for name, dep := range m {
		cond := dep.Condition
		if cond == "" {
			cond = "service_started"
		}
		(*d)[name] = cond
	}
	return nil
}

// composeStack is the parsed compose file with each Flo service found.
type composeStack struct {
	file composeFile
	// servers maps a Flo service name to its compose service, migrations
	// to its migrate step.
	servers, migrations map[string]string
	// configs holds each compose service's config as its binary would load
	// it from the compose environment.
	configs map[string]any
}

func loadCompose(t *testing.T) composeStack {
	t.Helper()
	b, err := os.ReadFile(composePath)
	require.NoError(t, err)
	st := composeStack{servers: map[string]string{}, migrations: map[string]string{}, configs: map[string]any{}}
	require.NoError(t, yaml.Unmarshal(b, &st.file), "parse %s", composePath)
	for _, name := range sortedKeys(st.file.Services) {
		svc := st.file.Services[name]
		if svc.Build == nil || svc.Build.Args["SERVICE"] == "" {
			continue
		}
		flo := svc.Build.Args["SERVICE"]
		require.Equal(t, "flo-"+flo+":dev", svc.Image, "%s: image name", name)
		require.Equal(t, "deploy/Dockerfile", svc.Build.Dockerfile, "%s: dockerfile", name)
		fs, ok := floServices[flo]
		require.True(t, ok, "%s: no Flo service %q", name, flo)
		where := composePath + ": " + name
		switch {
		case slices.Equal(svc.Command, []string{"migrate"}):
			require.True(t, fs.schema, "%s: %s keeps no schema, so it needs no migrate step", where, flo)
			require.Empty(t, st.migrations[flo], "%s: a second migrate step for %s", where, flo)
			st.migrations[flo] = name
			st.configs[name] = migrateConfig()
		case len(svc.Command) == 0:
			require.Empty(t, st.servers[flo], "%s: a second %s", where, flo)
			st.servers[flo] = name
			st.configs[name] = fs.serve()
		default:
			t.Fatalf("%s: unexpected command %q", where, svc.Command)
		}
		checkEnv(t, where, st.configs[name], svc.Environment)
	}
	return st
}

func TestComposeGivesEachServiceOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	st := loadCompose(t)
	for _, flo := range allFive {
		require.NotEmpty(t, st.servers[flo], "%s runs no %s", composePath, flo)
		if floServices[flo].schema {
			require.NotEmpty(t, st.migrations[flo], "%s has no migrate step for %s", composePath, flo)
		}
	}
}

// dependsOn reports whether from depends on to, directly or through other
// dependencies, and with which condition on the last step.
func (st composeStack) dependsOn(from, to string) (string, bool) {
	seen := map[string]bool{}
	var walk func(string) (string, bool)
	walk = func(s string) (string, bool) {
		if seen[s] {
			return "", false
		}
		seen[s] = true
		for dep, cond := range st.file.Services[s].DependsOn {
			if dep == to {
				return cond, true
			}
			if c, ok := walk(dep); ok {
				return c, true
			}
		}
		return "", false
	}
	return walk(from)
}

func TestComposeWiresTheServicesTogether(t *testing.T) {
	t.Parallel()
	st := loadCompose(t)
	// servedBy maps "compose service:port" to the Flo server listening there.
	servedBy := map[string]string{}
	for flo, name := range st.servers {
		servedBy[name+":"+port(t, stringField(st.configs[name], "GRPCAddr"))] = flo
	}

	for _, name := range sortedKeys(st.file.Services) {
		svc := st.file.Services[name]
		for dep := range svc.DependsOn {
			require.Contains(t, st.file.Services, dep, "%s depends on an unknown service", name)
		}
		needs := func(host, why string) {
			t.Helper()
			require.Contains(t, st.file.Services, host, "%s: %s names no compose service", name, why)
			cond, ok := st.dependsOn(name, host)
			require.True(t, ok, "%s: uses %s (%s) but does not depend on it", name, host, why)
			if st.file.Services[host].Healthcheck != nil {
				require.Contains(t, []string{"service_healthy", "service_completed_successfully"}, cond,
					"%s: must wait for %s to be healthy", name, host)
			}
		}
		for _, key := range sortedKeys(svc.Environment) {
			value := svc.Environment[key]
			switch {
			case key == "FLO_DATABASE_URL":
				u, err := url.Parse(value)
				require.NoError(t, err)
				needs(u.Hostname(), key)
			case key == "FLO_KAFKA_BROKERS":
				for _, b := range strings.Split(value, ",") {
					host, _, err := net.SplitHostPort(b)
					require.NoError(t, err)
					needs(host, key)
				}
			case key == "OTEL_EXPORTER_OTLP_ENDPOINT":
				u, err := url.Parse(value)
				require.NoError(t, err)
				require.Contains(t, st.file.Services, u.Hostname(), "%s: %s", name, key)
			case peerAddr(key):
				// A peer's internal API, such as FLO_DISPATCHER_ADDR.
				host, p, err := net.SplitHostPort(value)
				require.NoError(t, err, "%s: %s", name, key)
				want := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(key, "FLO_"), "_ADDR"))
				require.Equal(t, want, servedBy[host+":"+p], "%s: %s=%s must reach the %s's gRPC port", name, key, value, want)
				needs(host, key)
			}
		}
	}

	for flo, name := range st.servers {
		svc := st.file.Services[name]
		httpPort := port(t, stringField(st.configs[name], "HTTPAddr"))
		require.NotNil(t, svc.Healthcheck, "%s has no health check", name)
		require.Equal(t, composeStrings{"CMD", "/service", "healthcheck", "http://127.0.0.1:" + httpPort + "/readyz"}, svc.Healthcheck.Test,
			"%s: the health check must ask the service's own /readyz", name)
		if m := st.migrations[flo]; m != "" {
			require.Equal(t, "service_completed_successfully", svc.DependsOn[m], "%s must start after %s succeeded", name, m)
		}
	}
}

func TestComposeRunsTheQuickStartWorker(t *testing.T) {
	t.Parallel()
	st := loadCompose(t)
	var worker string
	for name, svc := range st.file.Services {
		if svc.Build != nil && svc.Build.Args["PACKAGE"] == "./examples/quickstart" {
			worker = name
		}
	}
	require.NotEmpty(t, worker, "%s runs no quick-start worker", composePath)
	svc := st.file.Services[worker]
	// The example dials localhost:9000, as in the reference.
	gw := st.servers["gateway"]
	require.Equal(t, "service:"+gw, svc.NetworkMode, "the worker must share the gateway's network to reach localhost:9000")
	require.Equal(t, "9000", port(t, stringField(st.configs[gw], "GRPCAddr")))
	require.Equal(t, "service_healthy", svc.DependsOn[gw])
	ns, _ := field(st.configs[st.servers["dispatcher"]], "BootstrapNamespaces").([]string)
	require.Contains(t, ns, "myapp", "the dispatcher must create the worker's namespace")
}

func TestComposePublishesOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	st := loadCompose(t)
	for _, name := range sortedKeys(st.file.Services) {
		for _, p := range st.file.Services[name].Ports {
			require.True(t, strings.HasPrefix(p, "127.0.0.1:"), "%s publishes %q beyond this machine", name, p)
		}
	}
	for _, backend := range []string{"redpanda", "postgres"} {
		require.Empty(t, st.file.Services[backend].Ports, "%s must not be published", backend)
	}
	gw := st.file.Services[st.servers["gateway"]]
	require.ElementsMatch(t, []string{"127.0.0.1:9000:9000", "127.0.0.1:8080:8080"}, gw.Ports)
}

// interpolated matches compose's ${NAME...} references.
var interpolated = regexp.MustCompile(`\$\{([A-Z_][A-Z0-9_]*)[^}]*\}`)

// TestComposeTokensComeFromTheEnvFile: the variables the compose file takes
// from its --env-file are the ones flo.env.example documents (and the
// Makefile writes), each required; every service gets the internal token
// and the gateway the admin key.
func TestComposeTokensComeFromTheEnvFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(composePath)
	require.NoError(t, err)
	used := map[string]bool{}
	for _, m := range interpolated.FindAllStringSubmatch(string(raw), -1) {
		used[m[1]] = true
		require.Contains(t, m[0], ":?", "%s must be required (${%s:?...}), not silently empty", m[1], m[1])
	}
	example, err := os.ReadFile("compose/flo.env.example")
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, line := range strings.Split(string(example), "\n") {
		if name, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			documented[name] = true
		}
	}
	require.Equal(t, documented, used, "the variables compose interpolates and those flo.env.example documents")
	makefile, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	for name := range documented {
		require.Contains(t, string(makefile), name+"=", "make compose-up must write %s into flo.env", name)
	}

	st := loadCompose(t)
	for _, flo := range allFive {
		env := st.file.Services[st.servers[flo]].Environment
		require.Contains(t, env["FLO_INTERNAL_TOKEN"], "${FLO_INTERNAL_TOKEN:?", "%s gets the internal token", flo)
	}
	require.Contains(t, st.file.Services[st.servers["gateway"]].Environment["FLO_ADMIN_TOKEN"], "${FLO_ADMIN_TOKEN:?", "the gateway gets the admin key")
}
