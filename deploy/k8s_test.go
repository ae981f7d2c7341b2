package deploy_test

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// overlays are the kustomize overlays users apply, by directory.
var overlays = []string{"k8s/overlays/dev", "k8s/overlays/production"}

// drainBudget is the longest a service takes to stop after SIGTERM, from the
// bounds in its service package: the gateway's shutdownTimeout (20 s) then
// its producer flush (5 s) and the telemetry flush (5 s); for the others,
// their gRPC stop (10 s), outbox flush (5 s) and HTTP stop (5 s), then the
// telemetry flush. Each Deployment's terminationGracePeriodSeconds
// must exceed it, or the kubelet kills replicas mid-drain.
const drainBudget = 30 * time.Second

// decoder decodes the API types a Flo install uses, failing on unknown and
// duplicate fields.
var decoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, autoscalingv2.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// k8sBuild is one built overlay, decoded.
type k8sBuild struct {
	dir         string
	namespace   string
	deployments map[string]*appsv1.Deployment // by app.kubernetes.io/name
	services    map[string]*corev1.Service    // by object name
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	pdbs        []*policyv1.PodDisruptionBudget
	jobs        map[string]*batchv1.Job // by app.kubernetes.io/name
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	namespaces  []*corev1.Namespace
	policies    []*networkingv1.NetworkPolicy
	others      []runtime.Object
}

// build runs kustomize on dir, as `kustomize build dir` would, and decodes
// every object strictly.
func build(t *testing.T, dir string) k8sBuild {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	b := k8sBuild{
		dir:         dir,
		deployments: map[string]*appsv1.Deployment{},
		services:    map[string]*corev1.Service{},
		jobs:        map[string]*batchv1.Job{},
		configMaps:  map[string]*corev1.ConfigMap{},
		secrets:     map[string]*corev1.Secret{},
	}
	require.NotEmpty(t, resources.Resources(), "kustomize build %s", dir)
	for _, r := range resources.Resources() {
		y, err := r.AsYAML()
		require.NoError(t, err)
		obj, err := decode(y)
		require.NoError(t, err, "%s: %s %s", dir, r.GetKind(), r.GetName())
		if ns := r.GetNamespace(); ns != "" {
			if b.namespace == "" {
				b.namespace = ns
			}
			require.Equal(t, b.namespace, ns, "%s: %s %s is in another namespace", dir, r.GetKind(), r.GetName())
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			name := o.Labels["app.kubernetes.io/name"]
			require.NotContains(t, b.deployments, name, "%s: two Deployments of %s", dir, name)
			b.deployments[name] = o
		case *corev1.Service:
			b.services[o.Name] = o
		case *autoscalingv2.HorizontalPodAutoscaler:
			b.hpas = append(b.hpas, o)
		case *policyv1.PodDisruptionBudget:
			b.pdbs = append(b.pdbs, o)
		case *batchv1.Job:
			name := o.Labels["app.kubernetes.io/name"]
			require.NotContains(t, b.jobs, name, "%s: two Jobs of %s", dir, name)
			b.jobs[name] = o
		case *corev1.ConfigMap:
			b.configMaps[o.Name] = o
		case *corev1.Secret:
			b.secrets[o.Name] = o
		case *corev1.Namespace:
			b.namespaces = append(b.namespaces, o)
		case *networkingv1.NetworkPolicy:
			b.policies = append(b.policies, o)
		default:
			b.others = append(b.others, o)
		}
	}
	return b
}

// decode decodes one object strictly: an unknown kind, an unknown field or
// a duplicate field is an error.
func decode(y []byte) (runtime.Object, error) {
	obj, _, err := decoder.Decode(y, nil, nil)
	return obj, err
}

func TestKubernetesStrictDecodeRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	_, err := decode([]byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: x
          image: x
          readinesProbe: {httpGet: {path: /readyz, port: 8080}}
`))
	require.ErrorContains(t, err, "readinesProbe")
	_, err = decode([]byte("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n"))
	require.Error(t, err, "an unknown kind must fail")
}

func TestKubernetesOverlaysBuild(t *testing.T) {
	t.Parallel()
	for _, dir := range append([]string{"k8s/base"}, overlays...) {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			b := build(t, dir)
			for _, flo := range allFive {
				require.Contains(t, b.deployments, flo, "%s: no Deployment of %s", dir, flo)
			}
		})
	}
}

// eachOverlay runs fn on every overlay's build in parallel subtests.
func eachOverlay(t *testing.T, fn func(t *testing.T, b k8sBuild)) {
	t.Helper()
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			fn(t, build(t, dir))
		})
	}
}

func TestKubernetesOverlaysHaveANamespace(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		require.NotEmpty(t, b.namespace, "%s: objects must be namespaced", b.dir)
		require.Len(t, b.namespaces, 1)
		require.Equal(t, b.namespace, b.namespaces[0].Name)
	})
}

// container returns the pod's only container.
func container(t *testing.T, what string, spec corev1.PodSpec) corev1.Container {
	t.Helper()
	require.Len(t, spec.Containers, 1, "%s: one container", what)
	return spec.Containers[0]
}

// checkPodHardening checks the settings every Flo pod shares: non-root,
// no privilege escalation, a read-only root, no injected service links.
func checkPodHardening(t *testing.T, what string, spec corev1.PodSpec) {
	t.Helper()
	c := container(t, what, spec)
	psc, csc := spec.SecurityContext, c.SecurityContext
	require.NotNil(t, psc, "%s: pod securityContext", what)
	require.NotNil(t, csc, "%s: container securityContext", what)
	require.True(t, psc.RunAsNonRoot != nil && *psc.RunAsNonRoot, "%s: runAsNonRoot", what)
	require.True(t, psc.RunAsUser != nil && *psc.RunAsUser != 0, "%s: runAsUser must be a non-zero uid", what)
	require.True(t, csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation false", what)
	require.True(t, csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", what)
	require.NotNil(t, csc.Capabilities, "%s: capabilities", what)
	require.Contains(t, csc.Capabilities.Drop, corev1.Capability("ALL"), "%s: drop all capabilities", what)
	// Service links would add FLO_<SERVICE>_PORT and the like for the
	// flo-* Services: variables in our namespace nobody set.
	require.True(t, spec.EnableServiceLinks != nil && !*spec.EnableServiceLinks, "%s: enableServiceLinks false", what)
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		require.Contains(t, c.Resources.Requests, res, "%s: requests.%s", what, res)
	}
	require.Contains(t, c.Resources.Limits, corev1.ResourceMemory, "%s: limits.memory", what)
}

// podIP stands for the pod's address (fieldRef status.podIP) in the
// variables a test resolves.
const podIP = "192.0.2.10"

// varRef is a $(NAME) reference in an env value, which Kubernetes expands
// only when NAME is defined earlier in the container's environment.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// containerEnv resolves the variables a container gets: from its envFrom
// ConfigMaps and its env, $(NAME) references expanded as Kubernetes does.
// values holds those whose value the build knows (ConfigMap data, literals,
// Secrets the overlay generates, the pod's IP); names all that its service
// reads, which leaves out a variable outside FLO_* set only for others to
// reference (POD_IP).
func (b k8sBuild) containerEnv(t *testing.T, what string, c corev1.Container) (values map[string]string, names []string) {
	t.Helper()
	values = map[string]string{}
	defined := map[string]bool{}
	referenced := map[string]bool{}
	for _, from := range c.EnvFrom {
		require.NotNil(t, from.ConfigMapRef, "%s: envFrom takes ConfigMaps only", what)
		cm, ok := b.configMaps[from.ConfigMapRef.Name]
		require.True(t, ok, "%s: envFrom names a ConfigMap %q the build does not have", what, from.ConfigMapRef.Name)
		for k, v := range cm.Data {
			values[k] = v
			names = append(names, k)
			defined[k] = true
		}
	}
	for _, e := range c.Env {
		names = append(names, e.Name)
		switch {
		case e.ValueFrom == nil:
			values[e.Name] = varRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
				name := varRef.FindStringSubmatch(ref)[1]
				require.True(t, defined[name], "%s: %s refers to %s, which is not defined before it (Kubernetes would leave %s as it is)", what, e.Name, name, ref)
				referenced[name] = true
				return values[name]
			})
		case e.ValueFrom.FieldRef != nil:
			require.Equal(t, "status.podIP", e.ValueFrom.FieldRef.FieldPath, "%s: %s: the pod's IP is the one field a container takes", what, e.Name)
			values[e.Name] = podIP
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := b.configMaps[ref.Name]
			require.True(t, ok, "%s: %s names a ConfigMap %q the build does not have", what, e.Name, ref.Name)
			v, ok := cm.Data[ref.Key]
			require.True(t, ok, "%s: %s names a key %q ConfigMap %s does not have", what, e.Name, ref.Key, ref.Name)
			values[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if s, ok := b.secrets[ref.Name]; ok {
				v, ok := s.Data[ref.Key]
				require.True(t, ok, "%s: %s names a key %q Secret %s does not have", what, e.Name, ref.Key, ref.Name)
				values[e.Name] = string(v)
			}
		default:
			t.Errorf("%s: %s comes from neither a ConfigMap, a Secret nor the pod's IP", what, e.Name)
		}
		defined[e.Name] = true
	}
	slices.Sort(names)
	for i := 1; i < len(names); i++ {
		require.NotEqual(t, names[i-1], names[i], "%s: %s is set twice", what, names[i])
	}
	names = slices.DeleteFunc(names, func(n string) bool { return referenced[n] && !strings.HasPrefix(n, "FLO_") })
	return values, names
}

// serveConfig loads the config a Deployment's container would, failing t
// for variables its service does not read or cannot parse.
func (b k8sBuild) serveConfig(t *testing.T, flo string) any {
	t.Helper()
	d := b.deployments[flo]
	what := fmt.Sprintf("%s: Deployment %s", b.dir, d.Name)
	values, names := b.containerEnv(t, what, container(t, what, d.Spec.Template.Spec))
	cfg := floServices[flo].serve()
	for _, p := range append(nameProblems(cfg, names), valueProblems(cfg, values)...) {
		t.Errorf("%s: %s", what, p)
	}
	return cfg
}

func TestKubernetesDeploymentsAreSafeToRoll(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		for _, flo := range sortedKeys(b.deployments) {
			d := b.deployments[flo]
			what := fmt.Sprintf("%s: Deployment %s", b.dir, d.Name)
			require.Equal(t, "flo", d.Labels["app.kubernetes.io/part-of"], what)
			spec := d.Spec.Template.Spec
			checkPodHardening(t, what, spec)
			c := container(t, what, spec)

			// The autoscaler owns the replica count.
			require.Nil(t, d.Spec.Replicas, "%s: leave replicas to the HorizontalPodAutoscaler", what)
			require.NotNil(t, spec.TerminationGracePeriodSeconds, what)
			grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
			require.Greater(t, grace, drainBudget, "%s: terminationGracePeriodSeconds must exceed the drain", what)

			// Probes on the HTTP port the service listens on.
			require.NotNil(t, c.LivenessProbe, "%s: liveness probe", what)
			require.NotNil(t, c.ReadinessProbe, "%s: readiness probe", what)
			for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
				require.NotNil(t, probe.HTTPGet, "%s: %s probe is an HTTP GET", what, path)
				require.Equal(t, path, probe.HTTPGet.Path, what)
				require.Equal(t, "http", probe.HTTPGet.Port.String(), what)
			}
			if c.StartupProbe != nil {
				require.Equal(t, "/healthz", c.StartupProbe.HTTPGet.Path, what)
			}
		}
	})
}

// matches reports whether selector selects pods labelled podLabels.
func matches(t *testing.T, selector *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(selector)
	require.NoError(t, err)
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

func TestKubernetesEveryDeploymentHasAnAutoscalerABudgetAndAService(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		for _, flo := range sortedKeys(b.deployments) {
			d := b.deployments[flo]
			what := fmt.Sprintf("%s: Deployment %s", b.dir, d.Name)
			podLabels := d.Spec.Template.Labels
			require.True(t, matches(t, d.Spec.Selector, podLabels), "%s: selector must match its pods", what)

			var hpas []*autoscalingv2.HorizontalPodAutoscaler
			for _, h := range b.hpas {
				if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == d.Name {
					hpas = append(hpas, h)
				}
			}
			require.Len(t, hpas, 1, "%s: one HorizontalPodAutoscaler", what)
			h := hpas[0]
			require.Equal(t, "apps/v1", h.Spec.ScaleTargetRef.APIVersion, what)
			require.NotNil(t, h.Spec.MinReplicas, what)
			require.GreaterOrEqual(t, *h.Spec.MinReplicas, int32(1), what)
			require.GreaterOrEqual(t, h.Spec.MaxReplicas, *h.Spec.MinReplicas, what)
			require.NotEmpty(t, h.Spec.Metrics, "%s: the autoscaler needs a metric", what)

			var pdbs int
			for _, p := range b.pdbs {
				if matches(t, p.Spec.Selector, podLabels) {
					pdbs++
					require.True(t, (p.Spec.MaxUnavailable == nil) != (p.Spec.MinAvailable == nil), "%s: PodDisruptionBudget %s sets one bound", what, p.Name)
				}
			}
			require.Equal(t, 1, pdbs, "%s: one PodDisruptionBudget", what)

			var svcs int
			for _, s := range b.services {
				if matches(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, podLabels) {
					svcs++
					for _, job := range b.jobs {
						require.False(t, matches(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, job.Spec.Template.Labels),
							"%s: Service %s would send traffic to Job %s", what, s.Name, job.Name)
					}
				}
			}
			require.Equal(t, 1, svcs, "%s: one Service", what)
		}
	})
}

func TestKubernetesConfigIsReadByEachService(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		// servedBy maps "service:port" to the Flo server behind it.
		servedBy := map[string]string{}
		configs := map[string]any{}
		for _, flo := range sortedKeys(b.deployments) {
			_, known := floServices[flo]
			require.True(t, known, "%s: no Flo service %q", b.dir, flo)
			cfg := b.serveConfig(t, flo)
			configs[flo] = cfg
			d := b.deployments[flo]
			what := fmt.Sprintf("%s: Deployment %s", b.dir, d.Name)
			c := container(t, what, d.Spec.Template.Spec)
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			require.Equal(t, port(t, stringField(cfg, "GRPCAddr")), fmt.Sprint(ports["grpc"]), "%s: grpc containerPort", what)
			require.Equal(t, port(t, stringField(cfg, "HTTPAddr")), fmt.Sprint(ports["http"]), "%s: http containerPort", what)
			for _, s := range b.services {
				if !matches(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Labels) {
					continue
				}
				for _, sp := range s.Spec.Ports {
					require.Contains(t, ports, sp.TargetPort.String(), "%s: Service %s targets port %s", what, s.Name, sp.TargetPort.String())
					if sp.Name == "grpc" {
						servedBy[fmt.Sprintf("%s:%d", s.Name, sp.Port)] = flo
					}
				}
			}
		}
		// Peers' addresses reach their gRPC Services.
		for _, flo := range sortedKeys(b.deployments) {
			d := b.deployments[flo]
			values, _ := b.containerEnv(t, d.Name, d.Spec.Template.Spec.Containers[0])
			for _, key := range sortedKeys(values) {
				if !peerAddr(key) {
					continue
				}
				want := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(key, "FLO_"), "_ADDR"))
				host, p, err := net.SplitHostPort(values[key])
				require.NoError(t, err)
				require.Equal(t, want, servedBy[host+":"+p], "%s: %s %s=%s must reach the %s Service's gRPC port", b.dir, d.Name, key, values[key], want)
			}
		}
	})
}

func TestKubernetesMigrationJobs(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		for _, flo := range sortedKeys(b.deployments) {
			_, known := floServices[flo]
			require.True(t, known, "%s: no Flo service %q", b.dir, flo)
			job, ok := b.jobs[flo]
			if !floServices[flo].schema {
				require.False(t, ok, "%s: %s keeps no schema, so it needs no migration Job", b.dir, flo)
				continue
			}
			require.True(t, ok, "%s: no migration Job for %s", b.dir, flo)
			what := fmt.Sprintf("%s: Job %s", b.dir, job.Name)
			spec := job.Spec.Template.Spec
			checkPodHardening(t, what, spec)
			c := container(t, what, spec)
			require.Equal(t, []string{"migrate"}, c.Args, "%s: runs `%s migrate`", what, flo)
			require.Empty(t, c.Command, "%s: keeps the image's entrypoint", what)
			require.Equal(t, container(t, flo, b.deployments[flo].Spec.Template.Spec).Image, c.Image, "%s: migrates with the Deployment's image", what)
			require.Contains(t, []corev1.RestartPolicy{corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever}, spec.RestartPolicy, what)
			require.NotNil(t, job.Spec.ActiveDeadlineSeconds, "%s: a deadline bounds the wait for Postgres", what)
			values, names := b.containerEnv(t, what, c)
			require.Contains(t, names, "FLO_DATABASE_URL", what)
			cfg := migrateConfig()
			for _, p := range append(nameProblems(cfg, names), valueProblems(cfg, values)...) {
				t.Errorf("%s: %s", what, p)
			}
		}
		for flo := range b.jobs {
			require.Contains(t, b.deployments, flo, "%s: a migration Job for no Deployment", b.dir)
		}
	})
}

// secretRefs lists the Secrets the Flo pods of b read.
func (b k8sBuild) secretRefs() map[string]bool {
	refs := map[string]bool{}
	var specs []corev1.PodSpec
	for _, d := range b.deployments {
		specs = append(specs, d.Spec.Template.Spec)
	}
	for _, j := range b.jobs {
		specs = append(specs, j.Spec.Template.Spec)
	}
	for _, spec := range specs {
		for _, c := range spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					refs[e.ValueFrom.SecretKeyRef.Name] = true
				}
			}
		}
	}
	return refs
}

func TestKubernetesProductionTakesKafkaAndPostgresFromSecrets(t *testing.T) {
	t.Parallel()
	b := build(t, "k8s/overlays/production")
	require.Empty(t, b.secrets, "production must not carry Secrets: they are created in the cluster")
	require.Equal(t, map[string]bool{"flo-postgres": true, "flo-kafka": true, "flo-auth": true}, b.secretRefs())
	for _, flo := range sortedKeys(b.deployments) {
		_, names := b.containerEnv(t, flo, b.deployments[flo].Spec.Template.Spec.Containers[0])
		require.Contains(t, names, "FLO_KAFKA_BROKERS", flo)
		if floServices[flo].schema {
			require.Contains(t, names, "FLO_DATABASE_URL", flo)
		}
		image := b.deployments[flo].Spec.Template.Spec.Containers[0].Image
		_, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
		require.True(t, ok && tag != "" && tag != "latest", "production image %s must be pinned", image)
	}
}

func TestKubernetesDevSecretsResolve(t *testing.T) {
	t.Parallel()
	b := build(t, "k8s/overlays/dev")
	for ref := range b.secretRefs() {
		require.Contains(t, b.secrets, ref, "dev pods read a Secret the overlay does not make")
	}
	// The in-namespace Postgres and Redpanda they point at exist.
	for _, svc := range []string{"postgres", "redpanda"} {
		require.Contains(t, b.services, svc)
	}
}
