package deploy_test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pod is a source or target of traffic: its labels, its namespace's name
// and, for targets, its container ports.
type pod struct {
	what      string
	labels    map[string]string
	namespace string
	ports     []corev1.ContainerPort
}

// namespaceLabels are the labels Kubernetes gives every namespace.
func namespaceLabels(name string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": name}
}

// admits reports whether the build's NetworkPolicies let from reach to's
// container port named port, as the API defines it: a pod no ingress policy
// selects takes anything; otherwise some rule of a policy selecting it must
// admit the peer and the port.
func (b k8sBuild) admits(t *testing.T, from, to pod, port string) bool {
	t.Helper()
	var number int32
	for _, p := range to.ports {
		if p.Name == port {
			number = p.ContainerPort
		}
	}
	require.NotZero(t, number, "%s has no port %s", to.what, port)
	isolated := false
	for _, p := range b.policies {
		if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !selects(t, p.Spec.PodSelector, to.labels) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			if peerAdmitted(t, rule.From, from, to.namespace) && portAdmitted(rule.Ports, port, number) {
				return true
			}
		}
	}
	return !isolated
}

// selects is a pod selector's match, where the empty selector selects all.
func selects(t *testing.T, sel metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(&sel)
	require.NoError(t, err)
	return s.Empty() || matches(t, &sel, podLabels)
}

func peerAdmitted(t *testing.T, peers []networkingv1.NetworkPolicyPeer, from pod, policyNamespace string) bool {
	t.Helper()
	if len(peers) == 0 {
		return true
	}
	for _, peer := range peers {
		require.Nil(t, peer.IPBlock, "the policies admit pods, not address blocks")
		nsOK := from.namespace == policyNamespace
		if peer.NamespaceSelector != nil {
			nsOK = selects(t, *peer.NamespaceSelector, namespaceLabels(from.namespace))
		}
		podOK := peer.PodSelector == nil || selects(t, *peer.PodSelector, from.labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

func portAdmitted(ports []networkingv1.NetworkPolicyPort, name string, number int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Port == nil || p.Port.String() == name || p.Port.String() == fmt.Sprint(number) {
			return true
		}
	}
	return false
}

// floPods are the pods of the build's Deployments and Jobs, by name.
func (b k8sBuild) floPods() map[string]pod {
	pods := map[string]pod{}
	for name, d := range b.deployments {
		pods["deployment "+name] = pod{what: "deployment " + name, labels: d.Spec.Template.Labels, namespace: b.namespace,
			ports: d.Spec.Template.Spec.Containers[0].Ports}
	}
	for name, j := range b.jobs {
		pods["job "+name] = pod{what: "job " + name, labels: j.Spec.Template.Labels, namespace: b.namespace}
	}
	return pods
}

// strangers are pods that are not Flo's: one in the namespace, one in
// another namespace with a Flo gateway's labels.
func (b k8sBuild) strangers() []pod {
	return []pod{
		{what: "a pod of the namespace that is not Flo's", labels: map[string]string{"app": "debug"}, namespace: b.namespace},
		{what: "a gateway-labelled pod of another namespace", namespace: "elsewhere",
			labels: b.deployments["gateway"].Spec.Template.Labels},
	}
}

// callers maps each Flo service to the Deployments whose configuration dials
// its gRPC Service (FLO_<SERVICE>_ADDR), and to itself when its replicas call
// each other at the address each advertises (FLO_<SERVICE>_ADVERTISE_ADDR).
func (b k8sBuild) callers(t *testing.T) map[string][]string {
	t.Helper()
	byService := map[string]string{} // "service:port" -> Flo name
	for flo, d := range b.deployments {
		for _, s := range b.services {
			if matches(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Labels) {
				for _, sp := range s.Spec.Ports {
					byService[fmt.Sprintf("%s:%d", s.Name, sp.Port)] = flo
				}
			}
		}
	}
	out := map[string][]string{}
	for _, flo := range sortedKeys(b.deployments) {
		values, _ := b.containerEnv(t, flo, b.deployments[flo].Spec.Template.Spec.Containers[0])
		for key, value := range values {
			if strings.HasSuffix(key, advertiseSuffix) {
				out[flo] = append(out[flo], flo)
			}
			if !peerAddr(key) {
				continue
			}
			host, p, err := net.SplitHostPort(value)
			require.NoError(t, err)
			if callee := byService[host+":"+p]; callee != "" {
				out[callee] = append(out[callee], flo)
			}
		}
	}
	return out
}

func TestKubernetesEveryPodIsIsolated(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		labelled := map[string]map[string]string{}
		for name, p := range b.floPods() {
			labelled[name] = p.labels
		}
		for _, o := range b.others {
			if s, ok := o.(*appsv1.StatefulSet); ok {
				labelled["statefulset "+s.Name] = s.Spec.Template.Labels
			}
		}
		for _, name := range sortedKeys(labelled) {
			var isolated bool
			for _, p := range b.policies {
				isolated = isolated || (slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && selects(t, p.Spec.PodSelector, labelled[name]))
			}
			require.True(t, isolated, "%s: %s takes traffic no policy admits", b.dir, name)
		}
	})
}

// TestKubernetesInternalServicesAdmitOnlyTheirCallers: the gRPC port of every
// internal Service (dispatcher, registry, streams, workflow) takes calls from
// the gateway and from the Flo services configured to dial it, and from no
// other pod: not the other Flo pods, not a stranger in the namespace, not a
// gateway-labelled pod of another namespace.
func TestKubernetesInternalServicesAdmitOnlyTheirCallers(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		callers := b.callers(t)
		pods := b.floPods()
		for _, flo := range []string{"dispatcher", "registry", "streams", "workflow"} {
			target := pods["deployment "+flo]
			require.Contains(t, callers[flo], "gateway", "%s: the gateway does not dial %s", b.dir, flo)
			for _, name := range sortedKeys(pods) {
				src := pods[name]
				want := strings.HasPrefix(name, "deployment ") && slices.Contains(callers[flo], strings.TrimPrefix(name, "deployment "))
				require.Equal(t, want, b.admits(t, src, target, "grpc"), "%s: %s reaching %s's gRPC port", b.dir, name, flo)
			}
			for _, src := range b.strangers() {
				require.False(t, b.admits(t, src, target, "grpc"), "%s: %s reaches %s's gRPC port", b.dir, src.what, flo)
				require.False(t, b.admits(t, src, target, "http"), "%s: %s reaches %s's HTTP port", b.dir, src.what, flo)
			}
		}
		// The public edge stays reachable.
		for _, port := range []string{"grpc", "http"} {
			require.True(t, b.admits(t, b.strangers()[1], pods["deployment gateway"], port), "%s: the gateway's %s port", b.dir, port)
		}
	})
}

// TestKubernetesDispatcherReplicasReachEachOther: each dispatcher replica
// advertises its pod's IP and its gRPC port (gateways send claims to every
// replica; a replica forwards a report to the owner of the task's
// partition), and the policies let the other replicas and the gateways reach
// that port.
func TestKubernetesDispatcherReplicasReachEachOther(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		d := b.deployments["dispatcher"]
		what := fmt.Sprintf("%s: Deployment %s", b.dir, d.Name)
		c := container(t, what, d.Spec.Template.Spec)
		values, _ := b.containerEnv(t, what, c)
		var grpcPort int32
		for _, p := range c.Ports {
			if p.Name == "grpc" {
				grpcPort = p.ContainerPort
			}
		}
		require.Equal(t, net.JoinHostPort(podIP, fmt.Sprint(grpcPort)), values["FLO_DISPATCHER"+advertiseSuffix],
			"%s: a replica advertises its pod's IP and gRPC port", what)
		require.Contains(t, b.callers(t)["dispatcher"], "dispatcher", what)
		pods := b.floPods()
		for _, from := range []string{"dispatcher", "gateway"} {
			require.True(t, b.admits(t, pods["deployment "+from], pods["deployment dispatcher"], "grpc"),
				"%s: %s pods reach the dispatcher replicas' gRPC port", b.dir, from)
		}
	})
}

// TestKubernetesOnlyFloPodsReachKafkaAndPostgres: the in-namespace Postgres
// and Redpanda of the dev overlay take connections from every Flo pod (the
// services and their migration Jobs) and from nothing else. Production runs
// them outside the namespace and has none.
func TestKubernetesOnlyFloPodsReachKafkaAndPostgres(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		var backends int
		for _, o := range b.others {
			s, ok := o.(*appsv1.StatefulSet)
			if !ok {
				continue
			}
			backends++
			target := pod{what: "statefulset " + s.Name, labels: s.Spec.Template.Labels, namespace: b.namespace, ports: s.Spec.Template.Spec.Containers[0].Ports}
			port := target.ports[0].Name
			pods := b.floPods()
			for _, name := range sortedKeys(pods) {
				require.True(t, b.admits(t, pods[name], target, port), "%s: %s cannot reach %s", b.dir, name, s.Name)
			}
			for _, src := range b.strangers() {
				require.False(t, b.admits(t, src, target, port), "%s: %s reaches %s", b.dir, src.what, s.Name)
			}
		}
		if b.dir == "k8s/overlays/dev" {
			require.Equal(t, 2, backends, "%s: Postgres and Redpanda run in the namespace", b.dir)
		}
	})
}
